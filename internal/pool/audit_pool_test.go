package pool_test

import (
	"testing"
	"time"

	"github.com/boxcar-run/boxcar/internal/config"
)

// TestAuditPoolColdTakeKeepsWithinSlots: warm and taken sandboxes together never exceed the
// worker's slots (docs/configuration.md, "Warm sandboxes"). A one-slot worker with a warm
// sandbox of profile a takes a job of profile b (no pool): the cold start for b must not begin
// while a's warm sandbox still holds the only slot.
func TestAuditPoolColdTakeKeepsWithinSlots(t *testing.T) {
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

// TestAuditPoolColdTakeWhileStartsInFlight: the same bound while the warm sandboxes of profile
// a are still starting (a pod being scheduled): the starts are not called back, and the job of
// profile b starts its own sandbox beside them.
func TestAuditPoolColdTakeWhileStartsInFlight(t *testing.T) {
	t.Parallel()
	bn := setup(t, 2, map[string]config.Profile{"a": warmProfile(config.Warm{}), "b": config.Profile{}.WithDefaults()})
	bn.lag.set("t", 2, 0) // no mix known yet: the tenant's lag counts whole towards a
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

// TestAuditPoolDroppedSandboxRemovedAgain: a warm sandbox the pool drops (aged past max_age)
// whose removal fails once is tried again, as a taken sandbox whose close failed is
// (TestFailedCloseIsRemovedLater). Nothing else removes it while the worker runs: bubblewrap's
// leftovers are swept only at the next start, and the Kubernetes reaper keeps this worker
// run's unclaimed pool pods.
func TestAuditPoolDroppedSandboxRemovedAgain(t *testing.T) {
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
		t.Errorf("the aged warm sandbox whose removal failed once is still live after 4 rounds (%d sandboxes live, pool min 1): it is never removed", live)
	}
}
