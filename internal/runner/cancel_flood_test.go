package runner_test

import (
	"context"
	"maps"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/boxcar-run/boxcar/internal/agent"
	"github.com/boxcar-run/boxcar/internal/job"
	"github.com/boxcar-run/boxcar/internal/queue"
	"github.com/boxcar-run/boxcar/internal/runner"
)

// floodSize is how many cancel requests the flooding tenant writes: enough that the worker's
// watch takes many round trips to NATS to apply them all, far fewer than nats.cancel_max_bytes
// allows (about 400k).
const floodSize = 1500

// floodCancels writes n cancel requests of tenant for ids no job ever had, as a tenant with
// the right to write the cancel bucket may (submit cancel refuses an unknown job, the server
// does not), with no expiry as submit's are. It returns the ids.
func (b *bundle) floodCancels(tenant string, n int) []string {
	b.t.Helper()
	ctx := context.Background()
	js, err := jetstream.New(b.nc)
	if err != nil {
		b.t.Fatal(err)
	}
	ids := make([]string, n)
	for i := range ids {
		ids[i] = job.NewID()
		msg := nats.NewMsg("$KV." + queue.CancelBucketOf(tenant) + "." + tenant + "." + ids[i])
		msg.Data = []byte(`{"at":"2026-01-02T03:04:05Z","by":"flood@somewhere"}`)
		msg.Header.Set("Nats-TTL", "never")
		if _, err := js.PublishMsgAsync(msg); err != nil {
			b.t.Fatal(err)
		}
	}
	select {
	case <-js.PublishAsyncComplete():
	case <-ctx.Done():
	}
	return ids
}

// applyCount wraps a worker's queue and counts the flooding tenant's cancel requests its watch
// has applied (released: they name no job), so that a test can say how many of them were
// applied when something else happened: an order, not a time.
type applyCount struct {
	runner.Queue
	flooder string

	// hold, when set, holds the watch's release of the flooder's requests (all but exempt's)
	// once holdAfter of them are released, until it is closed: a backlog that takes as long
	// to apply as the test needs, whatever the machine's speed.
	hold      chan struct{}
	holdAfter int
	exempt    string

	mu       sync.Mutex
	released map[string]bool   // the flooder's ids released
	asked    map[queue.Ref]int // a job's first status with a cancel recorded: the releases then
	ran      map[string]int    // job ids the agent ran: the releases then
}

func countApplies(flooder string) (*applyCount, func(*runner.Config)) {
	q := &applyCount{flooder: flooder, released: map[string]bool{}, asked: map[queue.Ref]int{}, ran: map[string]int{}}
	return q, func(c *runner.Config) { q.Queue = c.Queue; c.Queue = q }
}

func (q *applyCount) ReleaseCancel(ctx context.Context, r queue.Ref) error {
	if q.hold != nil && r.Tenant == q.flooder && r.ID != q.exempt {
		q.mu.Lock()
		held := len(q.released) >= q.holdAfter
		q.mu.Unlock()
		if held {
			select {
			case <-q.hold:
			case <-ctx.Done():
				return ctx.Err()
			}
		}
	}
	err := q.Queue.ReleaseCancel(ctx, r)
	if r.Tenant == q.flooder && r.ID != q.exempt && err == nil {
		q.mu.Lock()
		q.released[r.ID] = true
		q.mu.Unlock()
	}
	return err
}

func (q *applyCount) UpdateStatus(ctx context.Context, r queue.Ref, change func(*job.Status), conds ...queue.StatusCond) (job.Status, error) {
	st, err := q.Queue.UpdateStatus(ctx, r, change, conds...)
	if err == nil && (st.CancelRequested || st.State == job.StateCancelled) {
		q.mu.Lock()
		if _, ok := q.asked[r]; !ok {
			q.asked[r] = len(q.released)
		}
		q.mu.Unlock()
	}
	return st, err
}

// noteRun records that the agent ran the job, and how many of the flood were applied then.
func (q *applyCount) noteRun(id string) {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.ran[id] = len(q.released)
}

func (q *applyCount) counts() (asked map[queue.Ref]int, ran map[string]int, released int) {
	q.mu.Lock()
	defer q.mu.Unlock()
	return maps.Clone(q.asked), maps.Clone(q.ran), len(q.released)
}

// TestCancelFloodOfOneTenantHoldsNoOther: team-a writes a backlog of cancel requests for ids
// that never were; then team-b cancels its running job. The worker's watch applies team-b's
// cancel before it has worked through team-a's backlog: one tenant's requests do not queue
// behind another's. (One watch for every tenant applied them in the order written: team-b's
// job ran on until every one of team-a's had been looked up and released.)
func TestCancelFloodOfOneTenantHoldsNoOther(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.withTenants("tenants:\n  team-a: {profiles: [p]}\n  team-b: {profiles: [p]}\n")
	ctx := context.Background()
	counted, wrap := countApplies("team-a")
	running := make(chan string, 1)
	b.worker(agentFunc(func(ctx context.Context, req agent.Request) (agent.Result, error) {
		running <- req.JobID
		<-ctx.Done()
		return agent.Result{}, ctx.Err()
	}), wrap)
	nc, _ := b.connect()
	teamB, err := queue.NewClient(ctx, nc, b.cfg.NATS, "team-b")
	if err != nil {
		t.Fatal(err)
	}
	j := b.newJob("p", "t")
	j.Inputs = nil
	if _, err := teamB.Publish(ctx, j); err != nil {
		t.Fatal(err)
	}
	<-running

	b.floodCancels("team-a", floodSize)
	if _, err := teamB.Cancel(ctx, j.ID, "tester"); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 2*time.Minute, "team-b's cancel to be applied", func() bool {
		asked, _, _ := counted.counts()
		_, ok := asked[queue.Ref{Tenant: "team-b", ID: j.ID}]
		return ok
	})
	asked, _, _ := counted.counts()
	n := asked[queue.Ref{Tenant: "team-b", ID: j.ID}]
	t.Logf("team-b's cancel applied with %d of team-a's %d requests applied", n, floodSize)
	if n >= floodSize {
		t.Errorf("team-b's cancel was applied after all %d of team-a's requests (%d applied before it); want it before team-a's backlog was drained", floodSize, n)
	}
	// The backlog is worked through all the same: each request released, as it names no job.
	waitFor(t, 2*time.Minute, "team-a's backlog to be applied", func() bool {
		_, _, released := counted.counts()
		return released == floodSize
	})
	st, err := teamB.WatchStatus(ctx, j.ID)
	if err != nil {
		t.Fatal(err)
	}
	var last job.Status
	for s := range st {
		last = s
	}
	if last.State != job.StateCancelled {
		t.Errorf("team-b's job ended %s, want cancelled", last.State)
	}
}

// TestCancelOfARunningJobPassesItsTenantsBacklog: a tenant's watch is working through a
// backlog of the tenant's own requests (held at its 10th, as a slow NATS would) when the tenant
// cancels its job running on the worker: the job stops and ends cancelled while the backlog is
// still held. (A watch applies its tenant's requests one after the other, so the job's cancel
// waited behind the whole backlog, its job running on meanwhile.)
func TestCancelOfARunningJobPassesItsTenantsBacklog(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	counted, wrap := countApplies(job.DefaultTenant)
	j := b.newJob("p", "t")
	j.Inputs = nil
	counted.hold, counted.holdAfter, counted.exempt = make(chan struct{}), 10, j.ID
	running := make(chan string, 1)
	b.worker(agentFunc(func(ctx context.Context, req agent.Request) (agent.Result, error) {
		running <- req.JobID
		<-ctx.Done()
		return agent.Result{}, ctx.Err()
	}), wrap)
	b.publish(j)
	<-running

	b.floodCancels(job.DefaultTenant, floodSize)
	waitFor(t, 2*time.Minute, "the watch to be held in the backlog", func() bool {
		_, _, released := counted.counts()
		return released == counted.holdAfter
	})
	if _, err := b.q.Cancel(ctx, j.ID, "tester"); err != nil {
		t.Fatal(err)
	}
	st := b.waitFinal(j.ID, time.Minute)
	close(counted.hold)
	asked, _, _ := counted.counts()
	t.Logf("the running job's cancel was applied with %d of the backlog's %d requests applied", asked[queue.Ref{Tenant: job.DefaultTenant, ID: j.ID}], floodSize)
	if st.State != job.StateCancelled {
		t.Errorf("the running job ended %s: %s, want cancelled", st.State, st.Error)
	}
	waitFor(t, 2*time.Minute, "the backlog to be applied", func() bool {
		_, _, released := counted.counts()
		return released == floodSize
	})
}

// TestWorkerStartedWithACancelBacklogRunsQueuedJobs: a worker starts while the cancel bucket
// holds a backlog of requests for ids that never were, and, written after them, the request of
// a queued job. It runs the other queued job before it has applied the whole backlog, and the
// cancelled one never runs: it ends cancelled. (The worker fetched nothing until it had applied
// every request there was.)
func TestWorkerStartedWithACancelBacklogRunsQueuedJobs(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	b.floodCancels(job.DefaultTenant, floodSize)
	cancelled := b.submit("p")
	if _, err := b.q.Cancel(ctx, cancelled.ID, "tester"); err != nil {
		t.Fatal(err)
	}
	queued := b.submit("p")

	counted, wrap := countApplies(job.DefaultTenant)
	b.worker(agentFunc(func(ctx context.Context, req agent.Request) (agent.Result, error) {
		counted.noteRun(req.JobID)
		return writeReport(ctx, req)
	}), wrap)
	if st := b.waitFinal(queued.ID, 2*time.Minute); st.State != job.StateSucceeded {
		t.Fatalf("the queued job ended %s: %s, want succeeded", st.State, st.Error)
	}
	if st := b.waitFinal(cancelled.ID, 2*time.Minute); st.State != job.StateCancelled {
		t.Fatalf("the job cancelled while queued ended %s: %s, want cancelled", st.State, st.Error)
	}
	_, ran, _ := counted.counts()
	if n, ok := ran[cancelled.ID]; ok {
		t.Errorf("the agent ran the job cancelled while queued (%d of the backlog applied then)", n)
	}
	t.Logf("the queued job ran with %d of the backlog's %d requests applied", ran[queued.ID], floodSize)
	if n := ran[queued.ID]; n >= floodSize {
		t.Errorf("the queued job ran once all %d requests of the backlog were applied; want before", floodSize)
	}
	if len(ran) != 1 {
		t.Errorf("the agent ran %v, want only the queued job", slices.Collect(maps.Keys(ran)))
	}
}

// TestCancelBehindAFloodOfTheTenantsOwnStillWins: a running worker's watch is behind a backlog
// of its tenant's requests (written while it ran, not at its start) when a queued job of that
// tenant is cancelled and then fetched: the job never runs, and ends cancelled. (It ran, to
// success, while the watch worked through the backlog toward its request.)
func TestCancelBehindAFloodOfTheTenantsOwnStillWins(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	var mu sync.Mutex
	release := map[string]chan struct{}{}
	running := make(chan string, 3)
	b.worker(agentFunc(func(ctx context.Context, req agent.Request) (agent.Result, error) {
		mu.Lock()
		ch := release[req.JobID]
		mu.Unlock()
		running <- req.JobID
		if ch != nil {
			<-ch
		}
		return writeReport(ctx, req)
	}))
	// Both slots busy, so that the job cancelled below waits in the queue.
	held := []job.Job{b.submitHeld(&mu, release), b.submitHeld(&mu, release)}
	for range held {
		<-running
	}
	b.floodCancels(job.DefaultTenant, floodSize)
	cancelled := b.submit("p")
	if _, err := b.q.Cancel(ctx, cancelled.ID, "tester"); err != nil {
		t.Fatal(err)
	}
	for _, j := range held {
		close(release[j.ID])
	}
	if st := b.waitFinal(cancelled.ID, 2*time.Minute); st.State != job.StateCancelled {
		t.Fatalf("the job cancelled while queued ended %s: %s, want cancelled", st.State, st.Error)
	}
	for range len(running) {
		if id := <-running; id == cancelled.ID {
			t.Error("the agent ran the job cancelled while queued")
		}
	}
}
