package runner_test

import (
	"context"
	"log/slog"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/boxcar-run/boxcar/internal/agent"
	"github.com/boxcar-run/boxcar/internal/config"
	"github.com/boxcar-run/boxcar/internal/job"
	"github.com/boxcar-run/boxcar/internal/queue"
	"github.com/boxcar-run/boxcar/internal/store"
)

// `worker setup` with a config that no longer lists a tenant (the chart runs it as the hook
// before the workers roll) dead-letters what the job stream holds for that tenant: also the
// job a worker is running at that moment. That worker goes on and commits the run, so the job
// ends twice: a committed `succeeded` run and an `unknown_tenant` dead letter, which
// docs/lifecycle.md promises never happens ("never a committed success and a dead letter").
func TestAuditFleetSetupRetiringATenantDeadLettersItsRunningJob(t *testing.T) {
	t.Parallel()
	b := setup(t)
	running, release := make(chan struct{}), make(chan struct{})
	b.worker(agentFunc(func(ctx context.Context, req agent.Request) (agent.Result, error) {
		close(running)
		<-release
		return writeReport(ctx, req)
	}))
	j := b.submit("p")
	<-running

	// The operator retires tenant default: setup with a config listing only alpha.
	admin, err := queue.NewAdmin(b.nc, b.cfg.NATS, map[string]config.Tenant{"alpha": {Profiles: []string{"p"}}}, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	if err := admin.Declare(context.Background()); err != nil {
		t.Fatal(err)
	}
	close(release)

	waitFor(t, 20*time.Second, "the running job to be committed", func() bool {
		_, err := b.store.Stat(context.Background(), store.ManifestKey(j.ID))
		return err == nil
	})
	m := b.manifest(j.ID)
	time.Sleep(500 * time.Millisecond) // the settling after the commit
	if st, err := b.q.Status(context.Background(), j.ID); err == nil {
		t.Logf("status after the commit: %s %q", st.State, st.Error)
	}
	var dead []string
	for _, dl := range b.deadLetters() {
		if dl.JobID == j.ID {
			dead = append(dead, dl.Reason)
		}
	}
	if m.Predicate.Outcome.State == job.StateSucceeded && len(dead) > 0 {
		t.Errorf("job %s ended twice: committed %s (manifest) and dead-lettered %v by setup while it ran; want one end",
			j.ID, m.Predicate.Outcome.State, dead)
	}
}

// TestSetupLoweringAckWaitLeavesRunningJobsAlone: `worker setup` lowers the consumer's
// ack_wait (30s to the shortest allowed here; a helm upgrade runs setup before it rolls the
// workers, whose running jobs then drain) while a worker runs a job. The server applies the new
// ack_wait to the running job at once; its heartbeats must already come often enough. (They
// came every third of the ack wait the delivery began with, 10s here: the job was delivered
// again while it ran, and ran twice.)
func TestSetupLoweringAckWaitLeavesRunningJobsAlone(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.setAckWait(30 * time.Second) // what the worker reads when it starts
	var runs atomic.Int32
	lowered := make(chan struct{})
	b.worker(agentFunc(func(ctx context.Context, req agent.Request) (agent.Result, error) {
		if runs.Add(1) == 1 {
			<-lowered
			select { // a job of a few seconds, long beside the new ack_wait
			case <-time.After(2 * config.MinAckWait):
			case <-ctx.Done():
				return agent.Result{}, ctx.Err()
			}
		}
		return writeReport(ctx, req)
	}))
	j := b.submit("p")
	waitFor(t, 10*time.Second, "the job to run", func() bool { return runs.Load() == 1 })
	b.setAckWait(config.MinAckWait)
	close(lowered)
	final := b.waitFinal(j.ID, 30*time.Second)
	if n := runs.Load(); n != 1 {
		t.Errorf("the job ran %d times (final %s, attempt %d); want once: its worker kept it alive throughout", n, final.State, final.Attempt)
	}
}

// The operator retires tenant default: `worker setup` with the new config (the chart runs it
// before it rolls the workers) dead-letters its queued jobs, takes its subjects off the job
// stream and removes its consumer. A worker of the old config that starts after it (a pod of
// the old ReplicaSet restarted or scaled up while the rollout runs) and may declare puts tenant
// default back on the job stream and recreates its consumer: the stream takes default's jobs
// again, though the deployment retired it, and once the workers run the new config none serves
// them (a worker leaves a tenant it does not list to "the workers that serve it"), so they wait
// for good. A running worker of the old config does the same when its pull sees its consumer
// deleted and its Declare lands after setup's (seen in 1 of 4 runs of an earlier version of
// this test; not deterministic, so not tested here).
func TestAuditFleetOldWorkerUndoesSetupRetiringATenant(t *testing.T) {
	t.Parallel()
	b := setup(t)
	admin, err := queue.NewAdmin(b.nc, b.cfg.NATS, map[string]config.Tenant{"alpha": {Profiles: []string{"p"}}}, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	if err := admin.Declare(context.Background()); err != nil {
		t.Fatal(err)
	}
	js, err := jetstream.New(b.nc)
	if err != nil {
		t.Fatal(err)
	}
	subjects := func() []string {
		s, err := js.Stream(context.Background(), b.cfg.NATS.Stream)
		if err != nil {
			t.Fatal(err)
		}
		return s.CachedInfo().Config.Subjects
	}
	t.Logf("after setup: %v", subjects())

	b.worker(agentFunc(writeReport)) // starts with the old config: tenant default
	if subs := subjects(); slices.Contains(subs, b.cfg.NATS.Subject+".default.*") {
		t.Errorf("a worker of the old config took tenant default back onto the job stream after setup retired it: subjects %v", subs)
	}
}
