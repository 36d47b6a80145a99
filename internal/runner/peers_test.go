package runner_test

import (
	"context"
	"errors"
	"log/slog"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/boxcar-run/boxcar/internal/agent"
	"github.com/boxcar-run/boxcar/internal/config"
	"github.com/boxcar-run/boxcar/internal/job"
	"github.com/boxcar-run/boxcar/internal/queue"
	"github.com/boxcar-run/boxcar/internal/runner"
)

// TestProfileOfALivePeerIsLeftToIt: a fleet mid-rollout. Worker "new" defines profiles p and q
// (its config was upgraded), worker "old" defines p only. `submit run --profile q` checks the
// live workers' profiles and lets the job through (worker "new" publishes q). When the job's
// delivery reaches worker "old", it is no fault of the job: a live peer defines q. The job is
// left to that peer (handed back, queued, no dead letter), not rejected for good as
// unknown_profile.
func TestProfileOfALivePeerIsLeftToIt(t *testing.T) {
	t.Parallel()
	b := setup(t)

	newCfg, err := config.Parse([]byte(profiles + `
  q:
    model: {name: m}
    tools: [{name: read_file}]
`))
	if err != nil {
		t.Fatal(err)
	}
	// Worker "new" is live: it publishes its profiles, as every worker does from its start.
	stopAdvertising := advertiseTenants(t, b, "worker-new", newCfg.Profiles, newCfg.TenantsOrDefault())

	// Worker "old" (profile p only) takes the job of profile q.
	// Its retry backoff keeps the job from it again until it is stopped.
	old := b.worker(agentFunc(writeReport), func(c *runner.Config) {
		c.Worker.WorkerID = "worker-old"
		c.Worker.NATS.RetryBackoff = config.Duration(5 * time.Second)
	})
	j := b.submit("q")
	// Status says queued before any worker wrote one too (the message is in the stream): the
	// delivery is settled once worker-old wrote its hand-back, or ended the job.
	waitFor(t, 20*time.Second, "worker-old to settle its delivery", func() bool {
		st, err := b.q.Status(context.Background(), j.ID)
		return err == nil && (st.State.Terminal() || st.State == job.StateQueued && st.Progress != "")
	})
	old.stop()
	if st, _ := b.q.Status(context.Background(), j.ID); st.State != job.StateQueued || !strings.Contains(st.Progress, "worker-new") {
		t.Errorf("after worker-old handed the job back: state %s, progress %q, error %q; want queued, waiting for worker-new", st.State, st.Progress, st.Error)
	}

	// Worker "new" comes up and would run it.
	stopAdvertising()
	b.cfg = newCfg
	b.worker(agentFunc(writeReport), func(c *runner.Config) {
		c.Worker.WorkerID = "worker-new"
		c.Logger = slog.New(slog.DiscardHandler)
	})
	final := b.waitFinal(j.ID, 30*time.Second)
	if final.State != job.StateSucceeded || len(b.settledLetters()) != 0 {
		t.Errorf("job of profile q, which live worker-new defines, ended %s (%s) on worker-old, which lacks q; dead letters: %v; want it left to worker-new and succeeded",
			final.State, final.Error, reasons(b.deadLetters()))
	}
}

// TestProfileOfALivePeerEndsAtTheLastDelivery: the hand-back is bounded. A job that only
// workers lacking its profile pick up (the peer that defines it never takes it) is handed back
// until its last delivery, which rejects it as unknown_profile, once.
func TestProfileOfALivePeerEndsAtTheLastDelivery(t *testing.T) {
	t.Parallel()
	b := setup(t)
	peer := map[string]config.Profile{"p": b.cfg.Profiles["p"], "q": b.cfg.Profiles["p"]}
	advertise(t, b, "worker-new", peer)

	b.worker(agentFunc(writeReport))
	j := b.submit("q")
	final := b.waitFinal(j.ID, 30*time.Second)
	if final.State != job.StateRejected || final.Attempt != b.cfg.NATS.MaxDeliver {
		t.Errorf("job of profile q, which only a peer that never takes it defines, ended %s at attempt %d (%s); want rejected at its last delivery, %d",
			final.State, final.Attempt, final.Error, b.cfg.NATS.MaxDeliver)
	}
	if got := reasons(b.settledLetters()); !slices.Equal(got, []string{"unknown_profile"}) {
		t.Errorf("dead letters %v, want one unknown_profile", got)
	}
}

func reasons(dls []queue.DeadLetter) []string {
	var out []string
	for _, d := range dls {
		out = append(out, d.Reason)
	}
	return out
}

// TestProfileGrantedToNoTenantIsNotLeftToItself: a job naming a profile that the fleet's only
// worker defines but grants to no tenant is refused by that worker (profile_not_granted) at its
// first delivery. Its published entry lists no tenant for the profile, which alone reads as a
// worker before tenants granting it to everyone; it says "granted to none" too
// (queue.ProfileInfo.GrantedToNone), so the worker does not hand the job back to itself,
// delivery after delivery, until max_deliver.
func TestProfileGrantedToNoTenantIsNotLeftToItself(t *testing.T) {
	t.Parallel()
	b := setup(t)
	cfg, err := config.Parse([]byte(profiles + `
  q:
    model: {name: m}
    tools: [{name: read_file}]
tenants:
  default:
    profiles: [p]
`))
	if err != nil {
		t.Fatal(err)
	}
	b.cfg = cfg
	// The worker publishes its profiles, as workercmd does from its start.
	advertiseTenants(t, b, "worker-1", cfg.Profiles, cfg.TenantsOrDefault())
	b.worker(agentFunc(writeReport), func(c *runner.Config) { c.Worker.WorkerID = "worker-1" })
	j := b.submit("q")
	final := b.waitFinal(j.ID, 30*time.Second)
	if final.State != job.StateRejected || final.Attempt != 1 {
		t.Errorf("job of profile q, which the fleet's only worker grants to no tenant, ended %s at attempt %d (%s); want rejected at its first delivery (profile_not_granted)",
			final.State, final.Attempt, final.Error)
	}
}

// fetchesJobTwice is a worker's queue that delivers the job id names twice, then fetches
// nothing more (a worker that stops taking jobs): with one slot, its third fetch comes after
// its second delivery of the job was handled.
type fetchesJobTwice struct {
	runner.Queue
	id string
	n  atomic.Int32
}

func (q *fetchesJobTwice) Fetch(ctx context.Context) (*queue.Delivery, error) {
	if q.n.Load() >= 2 {
		<-ctx.Done()
		return nil, ctx.Err()
	}
	d, err := q.Queue.Fetch(ctx)
	if err == nil && d.JobID == q.id {
		q.n.Add(1)
	}
	return d, err
}

// TestHandBacksDoNotSpendTheRunsDeliveries: during a rollout, a worker lacking the job's profile
// hands the job back to the live peer that defines it, twice (max_deliver 3). Then the peer
// takes it, and its runs fail transiently. The hand-backs ran nothing and met no fault: the job
// gets its max_deliver runs before it ends dead, not one run on what was its last delivery.
func TestHandBacksDoNotSpendTheRunsDeliveries(t *testing.T) {
	t.Parallel()
	b := setup(t)
	withQ := map[string]config.Profile{"p": b.cfg.Profiles["p"], "q": b.cfg.Profiles["p"]}
	advertise(t, b, "worker-new", withQ)
	j := b.newJob("q", "t")
	twice := &fetchesJobTwice{id: j.ID}
	old := b.worker(agentFunc(writeReport), func(c *runner.Config) {
		c.Worker.WorkerID, c.Worker.Concurrency = "worker-old", 1
		twice.Queue = c.Queue
		c.Queue = twice
	})
	b.publish(j)
	waitFor(t, 30*time.Second, "worker-old to take the job twice", func() bool { return twice.n.Load() >= 2 })
	old.stop() // once its deliveries are settled
	if st, err := b.q.Status(context.Background(), j.ID); err != nil || st.State != job.StateQueued {
		t.Fatalf("after worker-old's deliveries: %+v, %v; want the job queued, handed back", st, err)
	}
	var runs atomic.Int32
	b.worker(agentFunc(func(context.Context, agent.Request) (agent.Result, error) {
		runs.Add(1)
		return agent.Result{}, errors.New("the model endpoint answered an unusable body")
	}), func(c *runner.Config) {
		c.Worker.WorkerID, c.Worker.Profiles = "worker-new", withQ
	})
	final := b.waitFinal(j.ID, 60*time.Second)
	if final.State != job.StateDead || runs.Load() != int32(b.cfg.NATS.MaxDeliver) {
		t.Errorf("after 2 hand-backs the job ran %d times and ended %s (%s); want %d runs, then dead", runs.Load(), final.State, final.Error, b.cfg.NATS.MaxDeliver)
	}
	if got := reasons(b.settledLetters()); !slices.Equal(got, []string{"max_deliveries"}) {
		t.Errorf("dead letters %v, want one max_deliveries", got)
	}
}
