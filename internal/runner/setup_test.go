package runner_test

import (
	"context"
	"errors"
	"log/slog"
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

// Tests of `worker setup` run while workers run jobs, as the chart's hook runs it before the
// workers roll.

// TestSetupRetiringATenantLeavesItsRunningJobToItsRun: `worker setup` with a config that no
// longer lists a tenant (the chart runs it as the hook before the workers roll) dead-letters
// what the job stream holds for that tenant, but not the job a worker is running at that
// moment, nor its consumer: the run ends it once, and its ack removes it. (Dead-lettered, the
// job ended twice: a committed `succeeded` run and an `unknown_tenant` dead letter, which
// docs/lifecycle.md promises never happens.) The next setup removes the consumer.
func TestSetupRetiringATenantLeavesItsRunningJobToItsRun(t *testing.T) {
	t.Parallel()
	b := setup(t)
	running, release := make(chan struct{}), make(chan struct{})
	w := b.worker(agentFunc(func(ctx context.Context, req agent.Request) (agent.Result, error) {
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
	waitFor(t, 10*time.Second, "the job's status to follow its commit", func() bool {
		st, err := b.q.Status(context.Background(), j.ID)
		return err == nil && st.State.Terminal()
	})
	var dead []string
	for _, dl := range b.settledLetters() {
		if dl.JobID == j.ID {
			dead = append(dead, dl.Reason)
		}
	}
	if m.Predicate.Outcome.State != job.StateSucceeded || len(dead) > 0 {
		t.Errorf("job %s ended as committed %s (manifest) and dead-lettered %v by setup while it ran; want succeeded once",
			j.ID, m.Predicate.Outcome.State, dead)
	}
	w.stop() // the rollout ends: no worker of the old config is left
	if err := admin.Declare(context.Background()); err != nil {
		t.Fatal(err)
	}
	js, err := jetstream.New(b.nc)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := js.Consumer(context.Background(), queue.JobStream(b.cfg.NATS, "default"), b.cfg.NATS.Consumer+"-default"); !errors.Is(err, jetstream.ErrConsumerNotFound) && !errors.Is(err, jetstream.ErrStreamNotFound) {
		t.Errorf("after the next setup, the retired tenant's consumer: %v; want it removed", err)
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
