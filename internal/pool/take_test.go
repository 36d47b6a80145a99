package pool_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	dto "github.com/prometheus/client_model/go"

	"github.com/boxcar-run/boxcar/internal/backoff"
	"github.com/boxcar-run/boxcar/internal/config"
	"github.com/boxcar-run/boxcar/internal/pool"
	"github.com/boxcar-run/boxcar/internal/sandbox"
	"github.com/boxcar-run/boxcar/internal/sandbox/sandboxtest"
)

// TestTakeWarmThenCold: a take finds the warm sandbox, claimed for its tenant's job; with the pool
// empty the next one is started for its job; each counts as a hit or a miss.
func TestTakeWarmThenCold(t *testing.T) {
	t.Parallel()
	bn := setup(t, 4, map[string]config.Profile{"p": warmProfile(config.Warm{Min: 1, Max: 1})})
	bn.reconcile(t)
	a, warm := bn.take(t, "p", "job-a")
	if !warm {
		t.Fatal("first take was cold; the pool held one")
	}
	s := bn.b.started[0]
	if s.jobID != "job-a" || s.tenant != "t" || s.pool != "p" {
		t.Errorf("warm sandbox started for pool %q claimed for tenant %q's job %q; want pool p, tenant t's job-a", s.pool, s.tenant, s.jobID)
	}
	b, warm := bn.take(t, "p", "job-b")
	if warm {
		t.Error("second take was warm; the pool was empty")
	}
	if s := bn.b.started[1]; s.claimed || s.pool != "" {
		t.Errorf("cold sandbox: claimed %v, pool %q; want one started for its job", s.claimed, s.pool)
	}
	if h, m := testutil.ToFloat64(bn.m.Hits.WithLabelValues("p")), testutil.ToFloat64(bn.m.Misses.WithLabelValues("p")); h != 1 || m != 1 {
		t.Errorf("hits %v misses %v, want 1 and 1", h, m)
	}
	if n := testutil.CollectAndCount(bn.m.Claim); n != 2 {
		t.Errorf("claim histogram has %d series, want warm and cold", n)
	}
	taken := slices.Clone(bn.b.started) // before the closes: the pool then starts one for its minimum
	closeAll(t, a, b)
	for _, s := range taken {
		if !s.closed {
			t.Errorf("%s live after its job closed it", s.id)
		}
	}
	bn.p.Close()
}

// TestFailedCloseIsRemovedLater: a taken sandbox whose job could not remove it keeps its room
// while it may still run, and the pool removes it in the background; once it is gone the room
// is free and the pool warm again. Kept taken for good, one failed close would have left this
// one-slot pool without a warm sandbox for the rest of the worker's life.
func TestFailedCloseIsRemovedLater(t *testing.T) {
	t.Parallel()
	bn := setup(t, 1, map[string]config.Profile{"p": warmProfile(config.Warm{Min: 1, Max: 1})})
	bn.reconcile(t)
	sb, warm := bn.take(t, "p", "job-a")
	if !warm {
		t.Fatal("the take was cold; the pool held one")
	}
	taken := bn.b.started[0]
	taken.mu.Lock()
	taken.closeFails = 2 // the job's close and the pool's first try
	taken.mu.Unlock()
	if err := sb.Close(context.Background()); err == nil {
		t.Fatal("the job's close succeeded; the backend was to fail it")
	}
	bn.reconcile(t) // waits for the removal in the background
	taken.mu.Lock()
	closed := taken.closed
	taken.mu.Unlock()
	if !closed {
		t.Fatal("the sandbox whose close failed is still live after the pool settled")
	}
	bn.reconcile(t)
	if got := bn.size("p"); got != 1 {
		t.Errorf("pool size %d after the failed close's sandbox was removed, want its minimum 1", got)
	}
	if live, _ := bn.b.counts(); live != 1 {
		t.Errorf("%d sandboxes live, want the one warm sandbox", live)
	}
	bn.p.Close()
}

// TestDroppedWarmSandboxRemovedAgain: a warm sandbox the pool drops (aged past max_age) whose
// removal fails once is tried again, as a taken sandbox whose close failed is
// (TestFailedCloseIsRemovedLater). Nothing else would remove it while the worker runs:
// bubblewrap's leftovers are swept only at the next start.
func TestDroppedWarmSandboxRemovedAgain(t *testing.T) {
	t.Parallel()
	bn := setup(t, 2, map[string]config.Profile{"p": warmProfile(config.Warm{Min: 1, MaxAge: config.Duration(10 * time.Minute)})})
	bn.reconcile(t)
	aged := bn.b.started[0]
	aged.mu.Lock()
	aged.closeFails = 1 // the pool's first try
	aged.mu.Unlock()
	bn.clock.advance(10 * time.Minute)
	bn.reconcile(t) // ages it out: the removal fails
	for range 3 {
		bn.reconcile(t)
	}
	aged.mu.Lock()
	closed := aged.closed
	aged.mu.Unlock()
	live, _ := bn.b.counts()
	bn.p.Close()
	if !closed {
		t.Errorf("the aged warm sandbox whose removal failed once is still live after 4 rounds (%d sandboxes live, pool min 1)", live)
	}
}

// TestTakeUnpooledProfile: a profile without warm settings always starts cold and records
// nothing in the pool's metrics.
func TestTakeUnpooledProfile(t *testing.T) {
	t.Parallel()
	bn := setup(t, 2, map[string]config.Profile{"p": warmProfile(config.Warm{Min: 1}), "cold": config.Profile{}.WithDefaults()})
	bn.reconcile(t)
	sb, warm := bn.take(t, "cold", "job-1")
	if warm {
		t.Error("a profile without a pool took a warm sandbox")
	}
	if n := testutil.CollectAndCount(bn.m.Misses); n != 0 {
		t.Errorf("misses recorded for a profile without a pool")
	}
	closeAll(t, sb)
	bn.p.Close()
}

// TestClaimFailureReplaced: a warm sandbox that cannot be claimed is removed, and the take
// goes on to the next one; the pool replaces it once the claim's backoff has passed
// (TestFailingClaimsBackOff).
func TestClaimFailureReplaced(t *testing.T) {
	t.Parallel()
	bn := setup(t, 4, map[string]config.Profile{"p": warmProfile(config.Warm{Min: 1, Max: 1})})
	bn.b.claimErr = sandbox.ErrClosed
	bn.reconcile(t)
	bn.b.claimErr = nil
	sb, warm := bn.take(t, "p", "job-1")
	bn.p.Settle()
	if warm {
		t.Error("take was warm although the only warm sandbox could not be claimed")
	}
	if !bn.b.started[0].closed {
		t.Error("the sandbox that failed its claim was not removed")
	}
	if got := testutil.ToFloat64(bn.m.Replaced.WithLabelValues("p", "claim_failed")); got != 1 {
		t.Errorf("removed claim_failed = %v, want 1", got)
	}
	bn.clock.advance(backoff.Max)
	bn.reconcile(t)
	if got := bn.size("p"); got != 1 {
		t.Errorf("pool %d after the failed one, want it replaced", got)
	}
	closeAll(t, sb)
	bn.p.Close()
}

// TestFailingClaimsBackOff: warm sandboxes that cannot be claimed (a pod the worker may not
// patch, a Root an operator cleaned) hold the profile's starts back as failed starts do, and
// the take goes cold once those ready or starting have failed theirs. Each removal's end
// refilled the pool at once, and the take waited for that start too, and claimed it, and
// removed it: it went round until its job's context ended, a pod created and deleted each time,
// and the job failed rather than start its own sandbox.
func TestFailingClaimsBackOff(t *testing.T) {
	t.Parallel()
	bn := setup(t, 4, map[string]config.Profile{"p": warmProfile(config.Warm{Min: 2})})
	bn.b.claimErr = errors.New("fake: pods \"sb\" is forbidden")
	bn.reconcile(t)
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	claims := 0
	bn.b.mu.Lock()
	bn.b.claimHook = func() {
		// The removals the failed claims began end, and what they start is ready, before
		// this claim answers: the slowest claim, the fastest backend.
		bn.p.Settle()
		if claims++; claims == 10 {
			cancel()
		}
	}
	bn.b.mu.Unlock()
	sb, warm, err := bn.p.Take(ctx, "t", "p", "job-1", sandbox.Spec{})
	if err != nil {
		t.Fatalf("take after %d failed claims: %v; want it cold once the 2 warm ones failed theirs", claims, err)
	}
	if warm || claims != 2 {
		t.Errorf("take warm %v after %d claims, want cold after the 2 warm sandboxes' claims", warm, claims)
	}
	bn.b.mu.Lock()
	bn.b.claimHook, bn.b.claimErr = nil, nil
	bn.b.mu.Unlock()
	closeAll(t, sb)
	bn.clock.advance(backoff.Max)
	bn.reconcile(t)
	if got := bn.size("p"); got != 2 {
		t.Errorf("pool %d after the backoff, want its min of 2 again", got)
	}
	bn.p.Close()
}

// TestTakeWaitsForStart: a take that finds a warm sandbox still starting waits for it rather
// than starting another.
func TestTakeWaitsForStart(t *testing.T) {
	t.Parallel()
	bn := setup(t, 4, map[string]config.Profile{"p": warmProfile(config.Warm{Min: 1, Max: 1})})
	bn.b.gate = make(chan struct{})
	bn.p.Reconcile(context.Background()) // the start now waits at the gate
	type took struct {
		sb   sandbox.Sandbox
		warm bool
		err  error
	}
	got := make(chan took, 1)
	go func() {
		sb, warm, err := bn.p.Take(context.Background(), "t", "p", "job-1", sandbox.Spec{JobID: "job-1"})
		got <- took{sb, warm, err}
	}()
	close(bn.b.gate)
	r := <-got
	if r.err != nil {
		t.Fatal(r.err)
	}
	if !r.warm || len(bn.b.started) != 1 {
		t.Errorf("take warm %v after %d starts; want the one warm sandbox, no second start", r.warm, len(bn.b.started))
	}
	closeAll(t, r.sb)
	bn.p.Close()
}

// TestTakeStartError: a cold start that fails gives the room back.
func TestTakeStartError(t *testing.T) {
	t.Parallel()
	bn := setup(t, 1, map[string]config.Profile{"p": warmProfile(config.Warm{})})
	bn.b.failNext = 1
	if _, _, err := bn.p.Take(context.Background(), "t", "p", "job-1", sandbox.Spec{}); err == nil {
		t.Fatal("take succeeded with a failing backend")
	}
	bn.lag.set("p", 5)
	bn.reconcile(t)
	if got := bn.size("p"); got != 1 {
		t.Errorf("pool %d after a failed take, want the slot free again (1)", got)
	}
	bn.p.Close()
}

// TestWarmUpBeforeReady: a started sandbox nobody waits for is warmed up (sandbox.Warmer)
// before it counts as ready.
func TestWarmUpBeforeReady(t *testing.T) {
	t.Parallel()
	bn := setup(t, 4, map[string]config.Profile{"p": warmProfile(config.Warm{Min: 1, Max: 1})})
	bn.b.warmGate = make(chan struct{})
	bn.p.Reconcile(context.Background())
	waitFor(t, "the sandbox warming up", func() bool { return bn.b.warmedCount() == 1 })
	if got := bn.size("p"); got != 0 {
		t.Errorf("pool %d while its sandbox warms up, want 0", got)
	}
	close(bn.b.warmGate)
	bn.p.Settle()
	if got := bn.size("p"); got != 1 {
		t.Errorf("pool %d once warmed up, want 1", got)
	}
	bn.p.Close()
}

// TestTakeDuringWarmUp: a Take that comes while the pool's sandbox warms up gets it at once
// rather than waiting for the warm-up.
func TestTakeDuringWarmUp(t *testing.T) {
	t.Parallel()
	bn := setup(t, 4, map[string]config.Profile{"p": warmProfile(config.Warm{Min: 1, Max: 1})})
	bn.b.warmGate = make(chan struct{})
	defer close(bn.b.warmGate)
	bn.p.Reconcile(context.Background())
	waitFor(t, "the sandbox warming up", func() bool { return bn.b.warmedCount() == 1 })
	sb, warm := bn.take(t, "p", "job-1") // would block until the warm gate opens
	if !warm || len(bn.b.started) != 1 {
		t.Errorf("take warm %v after %d starts; want the warming sandbox", warm, len(bn.b.started))
	}
	closeAll(t, sb)
	bn.p.Close()
}

// TestNoWarmUpForWaitingTake: a sandbox started while a Take waits for it goes to that Take
// without a warm-up: the job would wait for it.
func TestNoWarmUpForWaitingTake(t *testing.T) {
	t.Parallel()
	bn := setup(t, 4, map[string]config.Profile{"p": warmProfile(config.Warm{Min: 1, Max: 1})})
	bn.b.gate = make(chan struct{})
	bn.p.Reconcile(context.Background()) // the start waits at the gate
	type took struct {
		sb   sandbox.Sandbox
		warm bool
	}
	got := make(chan took, 1)
	go func() {
		sb, warm, err := bn.p.Take(context.Background(), "t", "p", "job-1", sandbox.Spec{JobID: "job-1"})
		if err != nil {
			t.Error(err)
		}
		got <- took{sb, warm}
	}()
	waitFor(t, "the take waiting", func() bool { return bn.p.Waiters("p") == 1 })
	close(bn.b.gate)
	r := <-got
	if !r.warm {
		t.Error("the take did not get the pool's sandbox")
	}
	// Counted before the close: the slot it gives back is refilled, and that start is warmed.
	if n := bn.b.warmedCount(); n != 0 {
		t.Errorf("the sandbox a Take waited for was warmed up %d times, want 0", n)
	}
	if r.sb != nil {
		closeAll(t, r.sb)
	}
	bn.p.Close()
}

// TestNoWarmUpWhileJobsWait: a sandbox started while jobs wait in the queue, more than the
// pool has ready, is ready at once, without a warm-up: the next job takes it as soon as it is
// fetched, and would throw a warm-up still under way away. With no job waiting it is warmed up.
func TestNoWarmUpWhileJobsWait(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name       string
		min        int
		pending    uint64
		wantWarmed int
	}{
		{name: "jobs wait: no warm-up", pending: 3, wantWarmed: 0},
		{name: "none waits: warmed up", min: 2, wantWarmed: 2},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			bn := setup(t, 4, map[string]config.Profile{"p": warmProfile(config.Warm{Min: tt.min})})
			bn.lag.set("p", tt.pending)
			bn.reconcile(t)
			if got := bn.b.warmedCount(); got != tt.wantWarmed {
				t.Errorf("%d warm-ups, want %d", got, tt.wantWarmed)
			}
			if got, want := bn.size("p"), max(tt.min, int(tt.pending)); got != want {
				t.Errorf("pool %d, want %d ready", got, want)
			}
			bn.p.Close()
		})
	}
}

// TestColdTakeKeepsWithinSlots: warm and taken sandboxes together never exceed the worker's
// slots (docs/configuration.md, "Warm sandboxes"). A one-slot worker with a warm sandbox of
// profile a takes a job of profile b (no pool, or an empty one): a's warm sandbox is removed
// before b's cold start begins, not beside it.
func TestColdTakeKeepsWithinSlots(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name     string
		profiles map[string]config.Profile
		take     string
	}{
		{name: "unpooled profile", take: "b", profiles: map[string]config.Profile{
			"a": warmProfile(config.Warm{Min: 1}), "b": config.Profile{}.WithDefaults()}},
		{name: "another warm profile, empty", take: "b", profiles: map[string]config.Profile{
			"a": warmProfile(config.Warm{Min: 1}), "b": warmProfile(config.Warm{})}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			bn := setup(t, 1, tt.profiles)
			bn.reconcile(t)
			if live, _ := bn.b.counts(); live != 1 {
				t.Fatalf("%d sandboxes live after the first round, want a's one warm sandbox", live)
			}
			sb, warm := bn.take(t, tt.take, "job-b")
			if warm {
				t.Fatal("profile b took a warm sandbox")
			}
			_, peak := bn.b.counts()
			closeAll(t, sb)
			bn.p.Close()
			if peak > 1 {
				t.Errorf("%d sandboxes were live at once on a worker of 1 slot (a's warm one and b's cold one)", peak)
			}
		})
	}
}

// TestColdTakeCallsBackWarmStarts: the same bound while the warm sandboxes of profile a are
// still starting (a pod being scheduled): each job of profile b calls one start back and waits
// for it to end before starting its own sandbox.
func TestColdTakeCallsBackWarmStarts(t *testing.T) {
	t.Parallel()
	bn := setup(t, 2, map[string]config.Profile{"a": warmProfile(config.Warm{}), "b": config.Profile{}.WithDefaults()})
	bn.lag.set("t", 2) // no mix known yet: the tenant's lag counts whole towards a
	gate := make(chan struct{})
	bn.b.mu.Lock()
	bn.b.gate = gate
	bn.b.mu.Unlock()
	bn.p.Reconcile(t.Context()) // two starts of a, held at the gate
	bn.b.mu.Lock()
	bn.b.gate = nil // b's cold starts go through at once
	bn.b.mu.Unlock()
	x, _ := bn.take(t, "b", "job-1")
	y, _ := bn.take(t, "b", "job-2")
	close(gate) // a's starts end
	bn.p.Settle()
	_, peak := bn.b.counts()
	closeAll(t, x, y)
	bn.p.Close()
	if peak > 2 {
		t.Errorf("%d sandboxes were live at once on a worker of 2 slots", peak)
	}
}

// fullSandbox has every optional interface of a sandbox (sandboxtest.Full), and closes.
type fullSandbox struct{ sandboxtest.Full }

func (fullSandbox) Info() sandbox.Info          { return sandbox.Info{Backend: "full"} }
func (fullSandbox) Close(context.Context) error { return nil }

type fullBackend struct{}

func (fullBackend) Backend() string { return "full" }
func (fullBackend) Start(context.Context, sandbox.Spec) (sandbox.Sandbox, error) {
	return fullSandbox{}, nil
}

// TestTakenSandboxKeepsOptionalInterfaces: the sandbox a Take hands out, warm or cold, wraps
// the backend's (it gives its slot back on Close), and every optional interface the backend's
// has is found on it with sandbox.As: the runner's egress and the manifest's usage need them
// (a warm pool's wrapper once hid Usage, and every manifest said the backend counts nothing).
func TestTakenSandboxKeepsOptionalInterfaces(t *testing.T) {
	t.Parallel()
	p, err := pool.New(pool.Config{
		Provider: fullBackend{}, Slots: 2, Lag: &fakeLag{lag: map[string]pool.Lag{}}, Logger: slog.New(slog.DiscardHandler),
		Profiles: map[string]config.Profile{"warm": warmProfile(config.Warm{Min: 1}), "cold": config.Profile{}.WithDefaults()},
	})
	if err != nil {
		t.Fatal(err)
	}
	p.Reconcile(t.Context())
	p.Settle()
	for _, profile := range []string{"warm", "cold"} {
		sb, warm, err := p.Take(t.Context(), "t", profile, "job-"+profile, sandbox.Spec{})
		if err != nil {
			t.Fatal(err)
		}
		if warm != (profile == "warm") {
			t.Errorf("%s take: warm %v", profile, warm)
		}
		for name, found := range sandboxtest.Optional {
			if !found(sb) {
				t.Errorf("the %s take's sandbox hides the backend's %s", profile, name)
			}
		}
		closeAll(t, sb)
	}
	p.Close()
}

// TestAgedNotTaken: a warm sandbox past its max_age is never handed to a job, whether or not a
// round of the pool has aged it out yet (rounds come every Interval, and one waits for the
// queue's lag): taken, a pod claimed past the Ahead it was started with gave its job less than
// its lifetime (claimDeadline), and the manifest said so, where a cold one's says the lifetime.
func TestAgedNotTaken(t *testing.T) {
	t.Parallel()
	bn := setup(t, 2, map[string]config.Profile{"p": warmProfile(config.Warm{Min: 1, MaxAge: config.Duration(10 * time.Minute)})})
	bn.reconcile(t)
	aged := bn.b.started[0]
	bn.clock.advance(10 * time.Minute) // no round since
	sb, _ := bn.take(t, "p", "job-1")
	if got := sb.Info().ID; got == aged.id {
		t.Errorf("the take got %s, warm past its max_age; want another", got)
	}
	bn.p.Settle()
	aged.mu.Lock()
	closed := aged.closed
	aged.mu.Unlock()
	if !closed {
		t.Errorf("%s, past its max_age, is still live after the take", aged.id)
	}
	if got := testutil.ToFloat64(bn.m.Replaced.WithLabelValues("p", "aged")); got != 1 {
		t.Errorf("removed aged = %v, want 1", got)
	}
	closeAll(t, sb)
	bn.p.Close()
}

// TestConcurrentTakesKeepWithinSlots: as many jobs as the worker has slots take sandboxes of
// two warm profiles and a cold one at once, over and over, while the lag moves, rounds run,
// claims and closes fail now and then: never more sandboxes live than slots.
func TestConcurrentTakesKeepWithinSlots(t *testing.T) {
	t.Parallel()
	const slots = 3
	bn := setup(t, slots, map[string]config.Profile{
		"a": warmProfile(config.Warm{Min: 1}), "b": warmProfile(config.Warm{}), "c": config.Profile{}.WithDefaults(),
	})
	ctx, cancel := context.WithCancel(context.Background())
	var rounds sync.WaitGroup
	rounds.Add(1)
	go func() {
		defer rounds.Done()
		for i := 0; ctx.Err() == nil; i++ {
			bn.lag.set("a", uint64(i%5))
			bn.lag.set("b", uint64((i/3)%4))
			bn.clock.advance(7 * time.Second)
			bn.p.Reconcile(ctx)
		}
	}()
	var jobs sync.WaitGroup
	for j := range slots {
		jobs.Add(1)
		go func() {
			defer jobs.Done()
			for i := range 40 {
				bn.b.mu.Lock()
				if i%7 == j {
					bn.b.claimErr = errors.New("fake: the pod stopped")
				} else {
					bn.b.claimErr = nil
				}
				bn.b.mu.Unlock()
				sb, _, err := bn.p.Take(ctx, "t", []string{"a", "b", "c"}[(i+j)%3], fmt.Sprintf("job-%d-%d", j, i), sandbox.Spec{})
				if err != nil {
					t.Errorf("take: %v", err)
					return
				}
				if fs, ok := sandbox.As[*fakeSandbox](sb); ok && i%5 == 0 {
					fs.mu.Lock()
					fs.closeFails = 1
					fs.mu.Unlock()
				}
				_ = sb.Close(ctx)
			}
		}()
	}
	jobs.Wait()
	cancel()
	rounds.Wait()
	bn.p.Close()
	if _, peak := bn.b.counts(); peak > slots {
		t.Errorf("%d sandboxes were live at once, more than the %d slots", peak, slots)
	}
}

// TestMetricsCountWhatHappened: the pool's counters count a job once, and only for what it got.
// A Take that fails and is tried again (the runner tries again while the backend is
// unavailable) is one miss once it has its sandbox, not one per try; a Take cut short before
// it started anything is none; and a warm start the pool's own close cut short is no
// start_failed (boxcar_pool_removed_total). A take's claim time (boxcar_pool_claim_seconds) is
// the job's wait, from its first try to its sandbox: timed from its last try, the wait of a job
// whose first tries failed was cut to the last one's. A try long after (a later delivery) is
// timed alone.
func TestMetricsCountWhatHappened(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name            string
		run             func(t *testing.T, bn *bundle)
		wantMisses      float64
		wantStartFailed float64
		wantClaims      []float64 // seconds of the cold claims observed, as the fake clock counts them
	}{
		{name: "a cold start tried three times is one miss", wantMisses: 1, wantClaims: []float64{0}, run: func(t *testing.T, bn *bundle) {
			bn.b.failNext = 2
			for range 2 {
				if _, _, err := bn.p.Take(t.Context(), "t", "p", "job-1", sandbox.Spec{}); err == nil {
					t.Fatal("take succeeded with a failing backend")
				}
			}
			sb, warm := bn.take(t, "p", "job-1")
			if warm {
				t.Fatal("the take after the failures was warm")
			}
			closeAll(t, sb)
		}},
		{name: "a take tried again is timed from its first try", wantMisses: 1, wantClaims: []float64{3}, run: func(t *testing.T, bn *bundle) {
			bn.b.failNext = 1
			attempt := t.Context() // the runner tries again on its delivery's context
			if _, _, err := bn.p.Take(attempt, "t", "p", "job-1", sandbox.Spec{}); err == nil {
				t.Fatal("take succeeded with a failing backend")
			}
			bn.clock.advance(3 * time.Second)
			sb, _, err := bn.p.Take(attempt, "t", "p", "job-1", sandbox.Spec{})
			if err != nil {
				t.Fatal(err)
			}
			closeAll(t, sb)
		}},
		{name: "another delivery's take is timed alone", wantMisses: 1, wantClaims: []float64{0}, run: func(t *testing.T, bn *bundle) {
			bn.b.failNext = 1
			first, cancel := context.WithCancel(t.Context())
			if _, _, err := bn.p.Take(first, "t", "p", "job-1", sandbox.Spec{}); err == nil {
				t.Fatal("take succeeded with a failing backend")
			}
			cancel() // the delivery fails; the queue delivers the job again after retry_backoff
			bn.clock.advance(5 * time.Second)
			second, cancel := context.WithCancel(t.Context())
			defer cancel()
			sb, _, err := bn.p.Take(second, "t", "p", "job-1", sandbox.Spec{})
			if err != nil {
				t.Fatal(err)
			}
			closeAll(t, sb)
		}},
		{name: "a take tried long after is timed alone", wantMisses: 2, wantClaims: []float64{0, 0}, run: func(t *testing.T, bn *bundle) {
			bn.b.failNext = 1
			if _, _, err := bn.p.Take(t.Context(), "t", "p", "job-1", sandbox.Spec{}); err == nil {
				t.Fatal("take succeeded with a failing backend")
			}
			bn.clock.advance(time.Hour)
			sb, _ := bn.take(t, "p", "job-1")
			closeAll(t, sb)
			sb, _ = bn.take(t, "p", "job-2") // another job's take is its own
			closeAll(t, sb)
		}},
		{name: "a take cut short waiting for a slot is no miss", wantMisses: 1, wantClaims: []float64{0}, run: func(t *testing.T, bn *bundle) {
			held, _ := bn.take(t, "p", "job-1") // the one slot, cold: the one miss
			ctx, cancel := context.WithCancel(t.Context())
			cancel()
			if _, _, err := bn.p.Take(ctx, "t", "p", "job-2", sandbox.Spec{}); err == nil {
				t.Fatal("take on a full worker with its context cancelled succeeded")
			}
			closeAll(t, held)
		}},
		{name: "starts cut short by Close are no failed starts", run: func(t *testing.T, bn *bundle) {
			bn.b.mu.Lock()
			bn.b.gate = make(chan struct{}) // never opened: the starts end with Run's context
			bn.b.mu.Unlock()
			bn.lag.set("p", 1)
			ctx, cancel := context.WithCancel(t.Context())
			done := make(chan error, 1)
			go func() { done <- bn.p.Run(ctx) }()
			waitFor(t, "a warm start under way", func() bool { return bn.p.Starting("p") == 1 })
			cancel()
			if err := <-done; err != nil {
				t.Fatal(err)
			}
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			bn := setup(t, 1, map[string]config.Profile{"p": warmProfile(config.Warm{})})
			tt.run(t, bn)
			bn.p.Close()
			if got := testutil.ToFloat64(bn.m.Misses.WithLabelValues("p")); got != tt.wantMisses {
				t.Errorf("boxcar_pool_misses_total %v, want %v", got, tt.wantMisses)
			}
			if got := testutil.ToFloat64(bn.m.Replaced.WithLabelValues("p", "start_failed")); got != tt.wantStartFailed {
				t.Errorf(`boxcar_pool_removed_total{reason="start_failed"} %v, want %v`, got, tt.wantStartFailed)
			}
			wantSum := 0.0
			for _, c := range tt.wantClaims {
				wantSum += c
			}
			if n, sum := claimSeconds(t, bn.m, "p", "false"); n != uint64(len(tt.wantClaims)) || sum != wantSum {
				t.Errorf("boxcar_pool_claim_seconds{warm=\"false\"}: %d observed, %v s in all; want %v", n, sum, tt.wantClaims)
			}
		})
	}
}

// TestColdTakeKeepsWithinSlotsWhileClosing: a job that takes its sandbox while the pool closes
// (the worker drains: its jobs in flight still start theirs) waits for a slot as before, while
// the warm sandboxes the close removes, ready or still starting, may still run. Let through at
// once, it ran beside them: 2 sandboxes on a worker of 1 slot.
func TestColdTakeKeepsWithinSlotsWhileClosing(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name     string
		starting bool // a's warm sandbox is still starting when the pool closes (else ready)
	}{
		{name: "ready warm sandbox being removed"},
		{name: "warm start in flight", starting: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			bn := setup(t, 1, map[string]config.Profile{"a": warmProfile(config.Warm{Min: 1}), "b": config.Profile{}.WithDefaults()})
			gate := make(chan struct{})
			if tt.starting {
				bn.b.mu.Lock()
				bn.b.gate = gate
				bn.b.mu.Unlock()
				bn.p.Reconcile(t.Context())
			} else {
				bn.b.closeGate = gate // a's removal waits for the gate
				bn.reconcile(t)
			}
			closed := make(chan struct{})
			go func() {
				defer close(closed)
				bn.p.Close()
			}()
			waitFor(t, "the pool closing", bn.p.Closed)
			taken := make(chan sandbox.Sandbox, 1)
			go func() {
				bn.b.mu.Lock()
				bn.b.gate = nil // b's start goes through at once
				bn.b.mu.Unlock()
				sb, _ := bn.take(t, "b", "job-b")
				taken <- sb
			}()
			waitFor(t, "b's take waiting for a slot, or through", func() bool { return bn.p.RoomWaits() == 1 || len(taken) == 1 })
			close(gate)
			sb := <-taken
			<-closed
			_, peak := bn.b.counts()
			closeAll(t, sb)
			if peak > 1 {
				t.Errorf("%d sandboxes were live at once on a worker of 1 slot (a's warm one and b's cold one)", peak)
			}
		})
	}
}

// TestRemovalGivenUpAtCloseFreesItsSlot: a sandbox whose removal keeps failing holds its slot
// while the pool runs (TestFailedCloseIsRemovedLater); once the pool closes, its retries stop
// and it is the restart's clean-up's, and a job the draining worker still runs gets that slot
// rather than waiting for it until its own time runs out.
func TestRemovalGivenUpAtCloseFreesItsSlot(t *testing.T) {
	t.Parallel()
	bn := setup(t, 1, map[string]config.Profile{"p": warmProfile(config.Warm{}), "b": config.Profile{}.WithDefaults()})
	sb, _ := bn.take(t, "p", "job-a")
	stuck := bn.b.started[0]
	stuck.mu.Lock()
	stuck.closeFails = 1 << 30 // every try
	stuck.mu.Unlock()
	if err := sb.Close(t.Context()); err == nil {
		t.Fatal("the job's close succeeded; the backend was to fail it")
	}
	bn.p.Close()
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	other, _, err := bn.p.Take(ctx, "t", "b", "job-b", sandbox.Spec{JobID: "job-b"})
	if err != nil {
		t.Fatalf("a take after the close, beside a removal given up: %v", err)
	}
	closeAll(t, other)
}

// TestCloseWhileARemovalBegins: a job's sandbox whose close fails while the pool closes begins
// a removal (remove) just as Close waits for the removals in flight to end. Close waits for it
// as for the others; counted on a sync.WaitGroup, that Add from zero raced Close's Wait, which
// Go reports as a misuse and may panic on ("WaitGroup is reused before previous Wait has
// returned"): the race detector reports it here.
func TestCloseWhileARemovalBegins(t *testing.T) {
	t.Parallel()
	bn := setup(t, 2, map[string]config.Profile{"p": warmProfile(config.Warm{Min: 1})})
	bn.reconcile(t)
	sb, warm := bn.take(t, "p", "job-a")
	if !warm {
		t.Fatal("the take was cold; the pool held one")
	}
	taken := bn.b.started[0]
	taken.mu.Lock()
	taken.closeFails = 1 // the job's close
	taken.mu.Unlock()
	gate := make(chan struct{})
	bn.b.mu.Lock()
	bn.b.closeGate = gate // the next warm sandbox's removal waits for it
	bn.b.mu.Unlock()
	bn.reconcile(t)
	closed := make(chan struct{})
	go func() {
		defer close(closed)
		bn.p.Close()
	}()
	waitParked(t, "TestCloseWhileARemovalBegins", "(*Pool).Close(")
	close(gate)   // the warm sandbox's removal ends: nothing is in flight
	bn.p.Settle() // (without it the job's removal might begin before that one ended)
	if err := sb.Close(t.Context()); err == nil {
		t.Fatal("the job's close succeeded; the backend was to fail it")
	}
	<-closed
	bn.p.Settle()
	if live, _ := bn.b.counts(); live != 1 {
		t.Errorf("%d sandboxes live after the close, want the job's, whose removal was given up", live)
	}
}

// waitParked waits until the test's goroutine running fn (a function of the pool) waits for
// something (a channel, a semaphore), not for the pool's lock: the moment a race the test
// looks for can begin. The goroutines of the tests running beside it are told apart by test.
func waitParked(t *testing.T, test, fn string) {
	t.Helper()
	waitFor(t, fn+" waiting", func() bool {
		buf := make([]byte, 1<<16)
		for {
			n := runtime.Stack(buf, true)
			if n < len(buf) {
				buf = buf[:n]
				break
			}
			buf = make([]byte, 2*len(buf))
		}
		for g := range strings.SplitSeq(string(buf), "\n\n") {
			header, stack, _ := strings.Cut(g, "\n")
			if strings.Contains(stack, test) && strings.Contains(stack, fn) &&
				!strings.Contains(header, "running") && !strings.Contains(header, "runnable") && !strings.Contains(header, "Mutex") {
				return true
			}
		}
		return false
	})
}

// TestSizeFollowsReadyAtOnce: boxcar_pool_size is the ready sandboxes as they are, whichever
// path took one away. A take that ages the pool's last ready sandbox out (TestAgedNotTaken)
// and then starts its own, or waits for one starting, left the gauge at 1 until the next round
// or the aged one's removal ended.
func TestSizeFollowsReadyAtOnce(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name     string
		starting bool // a sandbox is starting when the take comes: it waits for that one
	}{
		{name: "the take starts its own"},
		{name: "the take waits for a start", starting: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			bn := setup(t, 2, map[string]config.Profile{"p": warmProfile(config.Warm{Min: 1, MaxAge: config.Duration(10 * time.Minute)})})
			gate := make(chan struct{})
			bn.b.closeGate = gate // the aged sandbox's removal lingers, as a pod's deletion does
			bn.reconcile(t)
			bn.clock.advance(9 * time.Minute)
			if tt.starting {
				bn.b.mu.Lock()
				bn.b.gate = gate
				bn.b.mu.Unlock()
				bn.lag.set("t", 2)
				bn.p.Reconcile(t.Context()) // a second sandbox starts, held at the gate
			}
			bn.clock.advance(time.Minute) // the first is past its max_age; no round since
			taken := make(chan sandbox.Sandbox, 1)
			go func() {
				sb, _ := bn.take(t, "p", "job-1")
				taken <- sb
			}()
			if tt.starting {
				waitFor(t, "the take waiting for the start", func() bool { return bn.p.Waiters("p") == 1 })
			} else {
				waitFor(t, "the take", func() bool { return len(taken) == 1 })
			}
			if got := bn.size("p"); got != 0 {
				t.Errorf("boxcar_pool_size %d once the take aged the only ready sandbox out, want 0", got)
			}
			close(gate)
			closeAll(t, <-taken)
			bn.p.Close()
		})
	}
}

// claimSeconds is how many claims of the profile boxcar_pool_claim_seconds observed, and their sum.
func claimSeconds(t *testing.T, m *pool.Metrics, profile, warm string) (uint64, float64) {
	t.Helper()
	var out dto.Metric
	if err := m.Claim.WithLabelValues(profile, warm).(prometheus.Histogram).Write(&out); err != nil {
		t.Fatal(err)
	}
	return out.GetHistogram().GetSampleCount(), out.GetHistogram().GetSampleSum()
}
