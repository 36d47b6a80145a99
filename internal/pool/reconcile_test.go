package pool_test

import (
	"context"
	"errors"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/boxcar-run/boxcar/internal/backoff"
	"github.com/boxcar-run/boxcar/internal/config"
	"github.com/boxcar-run/boxcar/internal/pool"
	"github.com/boxcar-run/boxcar/internal/queue"
	"github.com/boxcar-run/boxcar/internal/sandbox"
	"github.com/boxcar-run/boxcar/test/harness"
)

// TestTargetFollowsLag: the pool holds its lag (pending jobs), within min and max, and never
// more than the worker's slots.
func TestTargetFollowsLag(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name            string
		slots, min, max int
		pending         uint64
		want            int
	}{
		{name: "idle, min 0", slots: 4, want: 0},
		{name: "idle, min 2", slots: 4, min: 2, want: 2},
		{name: "pending", slots: 8, pending: 3, want: 3},
		{name: "max bounds", slots: 8, max: 3, pending: 10, want: 3},
		{name: "no max: the slots bound", slots: 4, pending: 10, want: 4},
		{name: "slots bound a larger max", slots: 4, max: 8, pending: 10, want: 4},
		{name: "slots bound min too", slots: 2, min: 3, want: 2},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			bn := setup(t, tt.slots, map[string]config.Profile{"p": warmProfile(config.Warm{Min: tt.min, Max: tt.max})})
			bn.lag.set("p", tt.pending)
			bn.reconcile(t)
			if got := bn.size("p"); got != tt.want {
				t.Errorf("pool size %d, want %d", got, tt.want)
			}
			bn.reconcile(t) // a second round changes nothing
			if got, _ := bn.b.counts(); got != tt.want {
				t.Errorf("%d sandboxes live after two rounds, want %d", got, tt.want)
			}
			bn.p.Close()
		})
	}
}

// TestFreeSlotsBound: warm and taken sandboxes together never exceed the worker's slots.
func TestFreeSlotsBound(t *testing.T) {
	t.Parallel()
	bn := setup(t, 3, map[string]config.Profile{"p": warmProfile(config.Warm{})})
	bn.lag.set("p", 10)
	bn.reconcile(t)
	a, warmA := bn.take(t, "p", "job-a")
	b, warmB := bn.take(t, "p", "job-b")
	if !warmA || !warmB {
		t.Fatalf("takes warm %v, %v; want both warm", warmA, warmB)
	}
	bn.reconcile(t)
	if got := bn.size("p"); got != 1 {
		t.Errorf("with 2 of 3 slots taken the pool holds %d, want 1", got)
	}
	closeAll(t, a)
	bn.reconcile(t)
	if got := bn.size("p"); got != 2 {
		t.Errorf("with 1 of 3 slots taken the pool holds %d, want 2", got)
	}
	closeAll(t, b)
	bn.p.Close()
	if _, peak := bn.b.counts(); peak > 3 {
		t.Errorf("%d sandboxes were live at once, more than the 3 slots", peak)
	}
}

// TestDrainsAfterIdle: once the lag drops the pool keeps its size for the idle time, then
// drains to its minimum.
func TestDrainsAfterIdle(t *testing.T) {
	t.Parallel()
	for _, minimum := range []int{0, 1} {
		bn := setup(t, 4, map[string]config.Profile{"p": warmProfile(config.Warm{Min: minimum, Idle: config.Duration(time.Minute)})})
		bn.lag.set("p", 20)
		bn.reconcile(t)
		bn.lag.set("p", 0)
		bn.clock.advance(59 * time.Second)
		bn.reconcile(t)
		if got := bn.size("p"); got != 4 {
			t.Errorf("min %d: within the idle time the pool holds %d, want 4", minimum, got)
		}
		bn.clock.advance(2 * time.Second)
		bn.reconcile(t)
		if got := bn.size("p"); got != minimum {
			t.Errorf("min %d: after the idle time the pool holds %d, want its minimum", minimum, got)
		}
		if live, _ := bn.b.counts(); live != minimum {
			t.Errorf("min %d: %d sandboxes live, want the drained ones removed", minimum, live)
		}
		bn.p.Close()
	}
}

// TestAgedReplaced: a warm sandbox nobody claimed within max_age is removed and replaced.
func TestAgedReplaced(t *testing.T) {
	t.Parallel()
	bn := setup(t, 4, map[string]config.Profile{"p": warmProfile(config.Warm{Min: 2, MaxAge: config.Duration(10 * time.Minute)})})
	bn.reconcile(t)
	first := append([]*fakeSandbox(nil), bn.b.started...)
	bn.clock.advance(10 * time.Minute)
	bn.reconcile(t)
	for _, s := range first {
		if !s.closed {
			t.Errorf("%s outlived its max_age", s.id)
		}
	}
	if got, live := bn.size("p"), len(bn.b.started); got != 2 || live != 4 {
		t.Errorf("pool %d after 4 starts %d; want 2 fresh sandboxes replacing the 2 aged", got, live)
	}
	if got := testutil.ToFloat64(bn.m.Replaced.WithLabelValues("p", "aged")); got != 2 {
		t.Errorf("removed aged = %v, want 2", got)
	}
	bn.p.Close()
}

// TestStartFailureRetried: a start that fails is tried again at the first round after its
// backoff (TestFailingStartsBackOff: not before).
func TestStartFailureRetried(t *testing.T) {
	t.Parallel()
	bn := setup(t, 4, map[string]config.Profile{"p": warmProfile(config.Warm{Min: 2})})
	bn.b.failNext = 1
	bn.reconcile(t)
	if got := bn.size("p"); got != 1 {
		t.Errorf("after one failed start the pool holds %d, want 1", got)
	}
	bn.clock.advance(backoff.Max)
	bn.reconcile(t)
	if got := bn.size("p"); got != 2 {
		t.Errorf("the next round left the pool at %d, want 2", got)
	}
	bn.p.Close()
}

// TestFailedStartKeepsItsSlot: a warm start that failed leaves its slot to its profile's share,
// which starts it again once its backoff has passed (TestStartFailureRetried); another profile
// wanting more does not take it meanwhile, which would have it removed again at each retry.
func TestFailedStartKeepsItsSlot(t *testing.T) {
	t.Parallel()
	bn := setupTenants(t, 2, map[string]config.Profile{
		"a": warmProfile(config.Warm{}),
		"b": warmProfile(config.Warm{}),
	}, map[string]config.Tenant{"ta": {Profiles: []string{"a"}}, "tb": {Profiles: []string{"b"}}})
	bn.lag.set("ta", 1)
	bn.reconcile(t)
	bn.lag.set("ta", 2)
	bn.lag.set("tb", 2)
	bn.b.mu.Lock()
	bn.b.failNext = 1 // b's one start, the only one of this round
	bn.b.mu.Unlock()
	bn.reconcile(t)
	if a, b := bn.size("a"), bn.size("b"); a != 1 || b != 0 {
		t.Errorf("pools a=%d b=%d while b backs off, want 1 and 0: b's slot kept for b", a, b)
	}
	bn.clock.advance(backoff.Max)
	bn.reconcile(t)
	if a, b := bn.size("a"), bn.size("b"); a != 1 || b != 1 {
		t.Errorf("pools a=%d b=%d after b's backoff, want 1 and 1", a, b)
	}
	bn.p.Close()
}

// TestProfilesShareSlots: minimums first, then the rest one at a time in name order.
func TestProfilesShareSlots(t *testing.T) {
	t.Parallel()
	bn := setup(t, 4, map[string]config.Profile{
		"a": warmProfile(config.Warm{Min: 1}),
		"b": warmProfile(config.Warm{Min: 2}),
	})
	bn.lag.set("a", 10)
	bn.lag.set("b", 10)
	bn.reconcile(t)
	if a, b := bn.size("a"), bn.size("b"); a != 2 || b != 2 {
		t.Errorf("pools a=%d b=%d, want 2 and 2 (minimums 1 and 2, then one more to a)", a, b)
	}
	bn.p.Close()
}

// TestLagErrorKeepsPool: a lag that cannot be read neither grows nor drains the pool.
func TestLagErrorKeepsPool(t *testing.T) {
	t.Parallel()
	bn := setup(t, 4, map[string]config.Profile{"p": warmProfile(config.Warm{})})
	bn.lag.set("p", 3)
	bn.reconcile(t)
	bn.lag.err = errors.New("nats: timeout")
	bn.clock.advance(time.Hour)
	bn.reconcile(t)
	if got := bn.size("p"); got != 3 {
		t.Errorf("with the lag unreadable the pool went to %d, want it kept at 3", got)
	}
	bn.p.Close()
}

// TestRunFillsAndDrainsOnStop: Run fills the pool ahead of the jobs, and removes every warm
// sandbox when it stops.
func TestRunFillsAndDrainsOnStop(t *testing.T) {
	t.Parallel()
	bn := setup(t, 4, map[string]config.Profile{"p": warmProfile(config.Warm{Min: 2})})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- bn.p.Run(ctx) }()
	waitFor(t, "the pool filled to its min, 2", func() bool { return bn.size("p") == 2 })
	sb, warm := bn.take(t, "p", "job-1")
	if !warm {
		t.Error("take after the pool filled was cold")
	}
	waitFor(t, "the taken sandbox replaced", func() bool { return bn.size("p") == 2 }) // replaced at once, not at the next tick
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if live, _ := bn.b.counts(); live != 1 {
		t.Errorf("%d sandboxes live after Run stopped, want only the taken one", live)
	}
	closeAll(t, sb)
}

// waitFor waits until cond holds. No test here needs the moment it came: each checks that it
// comes at all (the pool's own rounds are 500 ms apart), so the harness's backing-off wait does.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	harness.Wait(t, what, func() (bool, error) { return cond(), nil })
}

var _ sandbox.Claimer = (*fakeSandbox)(nil)

// TestReleaseRefillsAtOnce: a job that gives its slot back has it refilled at once, on the lag
// read last, without a round of Run or a lag read of its own: the next job, a few round trips
// away, finds the sandbox for that slot starting (docs/performance.md, row 16).
func TestReleaseRefillsAtOnce(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name        string
		pending     uint64 // at the last round before the release
		closeFirst  bool   // the pool is closed before the release
		wantStarted int    // by the release
	}{
		{name: "demand left: the slot is refilled", pending: 5, wantStarted: 1},
		{name: "no demand, min 0: nothing started", pending: 0},
		{name: "pool closed: nothing started", pending: 5, closeFirst: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			bn := setup(t, 1, map[string]config.Profile{"p": warmProfile(config.Warm{})})
			bn.lag.set("p", tt.pending)
			bn.reconcile(t)
			sb, _ := bn.take(t, "p", "job-1")
			bn.reconcile(t) // the one slot is taken: the pool holds nothing
			before, reads := len(bn.b.started), bn.lag.readCount()
			if tt.closeFirst {
				bn.p.Close()
			}
			closeAll(t, sb)
			bn.p.Settle()
			if got := len(bn.b.started) - before; got != tt.wantStarted {
				t.Errorf("the release started %d sandboxes, want %d", got, tt.wantStarted)
			}
			if got := bn.lag.readCount() - reads; got != 0 {
				t.Errorf("the release read the lag %d times, want none (the last read stands)", got)
			}
			if got := bn.size("p"); got != tt.wantStarted {
				t.Errorf("pool %d after the release, want %d", got, tt.wantStarted)
			}
			bn.p.Close()
			if live, _ := bn.b.counts(); live != 0 {
				t.Errorf("%d sandboxes live after Close, want 0", live)
			}
		})
	}
}

// TestCloseEndsStartsWarmingUp: Close waits for the starts in flight, a round's and a
// release's, and removes their sandboxes, without waiting for warm-ups that do not end.
func TestCloseEndsStartsWarmingUp(t *testing.T) {
	t.Parallel()
	bn := setup(t, 2, map[string]config.Profile{"p": warmProfile(config.Warm{Min: 2})})
	bn.b.warmGate = make(chan struct{})
	defer close(bn.b.warmGate)
	bn.p.Reconcile(context.Background()) // two starts, both held in their warm-up
	waitFor(t, "two starts warming up", func() bool { return bn.b.warmedCount() == 2 })
	sb, warm := bn.take(t, "p", "job-1") // gets one of them at once
	if !warm {
		t.Fatal("the take during the warm-up was cold")
	}
	closeAll(t, sb) // the release refills its slot: a third start, held in its warm-up too
	waitFor(t, "the release's start warming up", func() bool { return bn.b.warmedCount() == 3 })
	closed := make(chan struct{})
	go func() {
		bn.p.Close()
		close(closed)
	}()
	waitFor(t, "Close to return", func() bool {
		select {
		case <-closed:
			return true
		default:
			return false
		}
	})
	if live, _ := bn.b.counts(); live != 0 {
		t.Errorf("%d sandboxes live after Close, want 0", live)
	}
	for _, s := range bn.b.started {
		if !s.closed {
			t.Errorf("%s outlived Close", s.id)
		}
	}
}

// TestQueueLagCountsWhatCanStart: the worker's source gives each tenant's lag, its pending jobs
// only as many as its max_concurrent lets start.
func TestQueueLagCountsWhatCanStart(t *testing.T) {
	t.Parallel()
	src := pool.QueueLag(func(context.Context) ([]queue.Lag, error) {
		return []queue.Lag{
			{Tenant: "capped", Pending: 5, AckPending: 1, MaxAckPending: 3},
			{Tenant: "full", Pending: 4, AckPending: 2, MaxAckPending: 2},
			{Tenant: "uncapped", Pending: 7, AckPending: 1},
		}, nil
	})
	got, err := src.Lags(t.Context())
	want := []pool.Lag{{Tenant: "capped", Pending: 2}, {Tenant: "full", Pending: 0}, {Tenant: "uncapped", Pending: 7}}
	if err != nil || !slices.Equal(got, want) {
		t.Errorf("Lags = %+v, %v; want %+v", got, err, want)
	}
	failing := pool.QueueLag(func(context.Context) ([]queue.Lag, error) { return nil, errors.New("nats: timeout") })
	if _, err := failing.Lags(t.Context()); err == nil {
		t.Error("a lag that cannot be read gave no error")
	}
}

// fleetLag is the lag as every worker of a fleet reads it from the tenant's consumer
// (queue.Consumer.ConsumerLag): AckPending counts the jobs in flight on every worker.
type fleetLag struct {
	mu  sync.Mutex
	lag queue.Lag
}

func (f *fleetLag) set(pending, ackPending uint64) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.lag = queue.Lag{Tenant: "t", Pending: pending, AckPending: ackPending}
}

func (f *fleetLag) read(context.Context) ([]queue.Lag, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return []queue.Lag{f.lag}, nil
}

// TestOthersJobsInFlightAreNoDemand: jobs in flight on other workers already have their
// sandboxes there, so a worker whose own slots are idle neither grows its pool for them nor
// keeps it above its minimum once the queue has held nothing startable for the idle time.
func TestOthersJobsInFlightAreNoDemand(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name            string
		pending, others uint64 // before: pending jobs, and jobs in flight on other workers
		want            int    // after others take the pending jobs and idle passes
	}{
		{name: "others busy from the start: the pool stays at min", others: 3, want: 1},
		{name: "others took the pending jobs: the pool drains to min", pending: 3, want: 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			lag := &fleetLag{}
			lag.set(tt.pending, tt.others)
			bn := setupLag(t, 4, map[string]config.Profile{"p": warmProfile(config.Warm{Min: 1, Idle: config.Duration(time.Minute)})}, nil, pool.QueueLag(lag.read))
			bn.reconcile(t)
			lag.set(0, tt.pending+tt.others) // the other workers run every job: none is pending
			bn.reconcile(t)
			bn.clock.advance(61 * time.Second)
			bn.reconcile(t)
			if got := bn.size("p"); got != tt.want {
				t.Errorf("with %d jobs in flight elsewhere and none pending, the idle pool holds %d after idle, want its minimum %d", tt.pending+tt.others, got, tt.want)
			}
			bn.p.Close()
		})
	}
}

// TestProfilesHandOverSlotsWithinConcurrency: when the demand moves from one warm profile to
// another, the second grows only into slots the first's sandboxes have left: those being
// removed still run, and those starting may, and count against the worker's concurrency until
// they are gone. Then it grows at once, as a slot a job gives back is refilled
// (TestReleaseRefillsAtOnce): a start called back whose end freed its slot left a's pool empty
// until the next round.
func TestProfilesHandOverSlotsWithinConcurrency(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name     string
		starting bool // b's sandboxes are still starting when the demand moves (else ready)
	}{
		{name: "b's ready sandboxes are removed"},
		{name: "b's starts are called back", starting: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			bn := setupTenants(t, 2, map[string]config.Profile{
				"a": warmProfile(config.Warm{Idle: config.Duration(time.Minute)}),
				"b": warmProfile(config.Warm{Idle: config.Duration(time.Minute)}),
			}, map[string]config.Tenant{"ta": {Profiles: []string{"a"}}, "tb": {Profiles: []string{"b"}}})
			bn.lag.set("tb", 2)
			if tt.starting {
				bn.b.mu.Lock()
				bn.b.gate = make(chan struct{}) // never opened: b's starts end when called back
				bn.b.mu.Unlock()
				bn.p.Reconcile(t.Context())
				waitFor(t, "b's two starts at the gate", func() bool {
					bn.b.mu.Lock()
					defer bn.b.mu.Unlock()
					return bn.b.atGate == 2
				})
			} else {
				bn.reconcile(t)
				if got := bn.size("b"); got != 2 {
					t.Fatalf("pool b holds %d, want 2", got)
				}
				// b's sandboxes take a while to go: their first close fails, and the removal
				// tries again.
				for _, s := range bn.b.started {
					s.mu.Lock()
					s.closeFails = 1
					s.mu.Unlock()
				}
			}
			bn.lag.set("tb", 0)
			bn.lag.set("ta", 2)
			bn.clock.advance(61 * time.Second)
			bn.b.mu.Lock()
			bn.b.gate = nil // a's starts go through
			bn.b.mu.Unlock()
			bn.reconcile(t)
			if a, b := bn.size("a"), bn.size("b"); a != 2 || b != 0 {
				t.Errorf("pools a=%d b=%d once b's sandboxes are gone, want 2 and 0", a, b)
			}
			if _, peak := bn.b.counts(); peak > 2 {
				t.Errorf("%d sandboxes were live at once while b's went and a's came, more than the 2 slots", peak)
			}
			bn.p.Close()
		})
	}
}

// TestStartBeforeRunEndsWithThePool: a warm start begun before Run (a Take's refill, or a round
// of Reconcile while the worker starts) is cut short when the pool closes, by Close or by the
// end of Run's context, as a start Run began is. It ran on context.Background, and Close,
// which waits for every start, waited for the backend's Start to end by itself: a worker
// stopping while its backend hung never stopped.
func TestStartBeforeRunEndsWithThePool(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		name  string
		close func(bn *bundle)
	}{
		{name: "Close", close: func(bn *bundle) { bn.p.Close() }},
		{name: "Run's context ends", close: func(bn *bundle) {
			ctx, cancel := context.WithCancel(context.Background())
			cancel()
			_ = bn.p.Run(ctx)
		}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			bn := setup(t, 1, map[string]config.Profile{"p": warmProfile(config.Warm{Min: 1})})
			gate := make(chan struct{}) // the backend hangs
			bn.b.mu.Lock()
			bn.b.gate = gate
			bn.b.mu.Unlock()
			bn.p.Reconcile(t.Context())
			if n := bn.p.Starting("p"); n != 1 {
				t.Fatalf("%d starts under way, want 1", n)
			}
			closed := make(chan struct{})
			go func() {
				tt.close(bn)
				close(closed)
			}()
			select {
			case <-closed:
			case <-time.After(30 * time.Second):
				t.Error("the pool did not close while a start begun before Run hung")
				close(gate)
				<-closed
			}
			if live, _ := bn.b.counts(); live != 0 {
				t.Errorf("%d sandboxes live after the close", live)
			}
		})
	}
}
