package pool_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/boxcar-run/boxcar/internal/config"
	"github.com/boxcar-run/boxcar/internal/sandbox"
)

// TestWarmPoolsFollowTheirProfilesPart: the lag names no profile, so with two warm profiles
// each pool follows its profile's part of the tenant's, as its recent jobs split it; with
// nothing recent (or forgotten) each follows the whole, and the slots are shared as before.
func TestWarmPoolsFollowTheirProfilesPart(t *testing.T) {
	t.Parallel()
	a, b, c := take{"t", "a"}, take{"t", "b"}, take{"t", "c"} // c has no pool
	tests := []struct {
		name         string
		takes        []take
		forget       time.Duration // how long ago those jobs were
		wantA, wantB int
	}{
		{name: "no jobs yet: both follow the whole lag", wantA: 2, wantB: 2},
		{name: "only a's jobs", takes: []take{a, a, a, a}, wantA: 4, wantB: 0},
		{name: "three of a's to one of b's", takes: []take{a, a, a, b}, wantA: 3, wantB: 1},
		{name: "an unpooled profile's jobs take their part", takes: []take{a, a, c, c}, wantA: 2, wantB: 0},
		{name: "a mix long gone is forgotten", takes: []take{a, a, a, a}, forget: 5 * time.Minute, wantA: 2, wantB: 2},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			bn := setup(t, 4, twoWarm())
			// The tenant's lag: its subjects name no profile.
			checkPools(t, bn, tt.takes, tt.forget, map[string]uint64{"t": 4}, tt.wantA, tt.wantB)
		})
	}
}

// take is a job's take: its tenant and its profile.
type take struct{ tenant, profile string }

// twoWarm is the profiles of the mix's tests: a and b, warm, and c, not.
func twoWarm() map[string]config.Profile {
	return map[string]config.Profile{"a": warmProfile(config.Warm{}), "b": warmProfile(config.Warm{}), "c": config.Profile{}.WithDefaults()}
}

// checkPools takes each of takes, as job-<its index>, closing it at once, moves the clock on by forget, sets lags
// (pending, by tenant) and runs a round: then pools a and b hold wantA and wantB, and bn is
// closed.
func checkPools(t *testing.T, bn *bundle, takes []take, forget time.Duration, lags map[string]uint64, wantA, wantB int) {
	t.Helper()
	for i, tk := range takes {
		sb, _ := bn.takeAs(t, tk.tenant, tk.profile, fmt.Sprintf("job-%d", i))
		closeAll(t, sb)
	}
	bn.p.Settle()
	bn.clock.advance(forget)
	for tenant, n := range lags {
		bn.lag.set(tenant, n)
	}
	bn.reconcile(t)
	if a, b := bn.size("a"), bn.size("b"); a != wantA || b != wantB {
		t.Errorf("pools a=%d b=%d, want %d and %d", a, b, wantA, wantB)
	}
	bn.p.Close()
}

// TestTenantsLagCountsTowardsTheirProfiles: a tenant's lag warms only the profiles granted to
// it, split between them as that tenant's own recent jobs split, never as another tenant's did.
func TestTenantsLagCountsTowardsTheirProfiles(t *testing.T) {
	t.Parallel()
	tenants := map[string]config.Tenant{
		"one":   {Profiles: []string{"a"}},
		"two":   {Profiles: []string{"a", "b"}},
		"three": {Profiles: []string{"b", "c"}}, // c has no pool
		"four":  {Profiles: []string{"a", "b"}},
		"five":  {Profiles: []string{"a", "b"}},
	}
	tests := []struct {
		name         string
		takes        []take
		lags         map[string]uint64 // pending, by tenant
		wantA, wantB int
	}{
		{name: "a tenant's lag warms only its profiles", lags: map[string]uint64{"one": 3}, wantA: 3, wantB: 0},
		{name: "nothing recent: the whole lag towards each granted profile", lags: map[string]uint64{"two": 2}, wantA: 2, wantB: 2},
		{name: "another tenant's jobs do not split this one's lag",
			takes: []take{{"two", "a"}, {"two", "a"}, {"two", "a"}}, lags: map[string]uint64{"three": 2}, wantA: 0, wantB: 2},
		{name: "each tenant by its own mix",
			takes: []take{{"two", "b"}, {"two", "b"}}, lags: map[string]uint64{"one": 1, "two": 2}, wantA: 1, wantB: 2},
		{name: "an unpooled profile's jobs take their part",
			takes: []take{{"three", "c"}, {"three", "b"}}, lags: map[string]uint64{"three": 2}, wantA: 0, wantB: 1},
		{name: "a tenant the worker does not serve warms nothing", lags: map[string]uint64{"stranger": 4}, wantA: 0, wantB: 0},
		{name: "the tenants' parts are added before they are rounded",
			takes: []take{{"two", "a"}, {"two", "b"}, {"four", "a"}, {"four", "b"}, {"five", "a"}, {"five", "b"}},
			lags:  map[string]uint64{"two": 1, "four": 1, "five": 1}, wantA: 2, wantB: 2},
		{name: "thirds that make a whole keep one",
			takes: []take{{"two", "a"}, {"two", "b"}, {"two", "b"}, {"four", "a"}, {"four", "b"}, {"four", "b"}, {"five", "a"}, {"five", "b"}, {"five", "b"}},
			lags:  map[string]uint64{"two": 1, "four": 1, "five": 1}, wantA: 1, wantB: 2},
		// 3 x 1/5 + 3 x 2/5 + 3 x 2/5 is 3.0000000000000004 in floating point, whatever the
		// order: three sandboxes, not four.
		{name: "parts that add up to a hair over a whole do not round up",
			takes: []take{{"two", "a"}, {"two", "b"}, {"two", "b"}, {"two", "b"}, {"two", "b"},
				{"four", "a"}, {"four", "a"}, {"four", "b"}, {"four", "b"}, {"four", "b"},
				{"five", "a"}, {"five", "a"}, {"five", "b"}, {"five", "b"}, {"five", "b"}},
			lags: map[string]uint64{"two": 3, "four": 3, "five": 3}, wantA: 3, wantB: 6},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			checkPools(t, setupTenants(t, 16, twoWarm(), tenants), tt.takes, 0, tt.lags, tt.wantA, tt.wantB)
		})
	}
}

// TestMixCountsEachJobOnce: a tenant's mix counts its jobs, each once, however often its Take
// is tried: the runner tries a Take again while the backend is unavailable, and a job whose
// attempt was cut short may be delivered here again. Counted at every try, a's one job tried
// three times weighed three of b's one, and a's pool took three of the tenant's four pending.
func TestMixCountsEachJobOnce(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name  string
		retry func(t *testing.T, bn *bundle) // tries a's job-0, and fails, before it succeeds
	}{
		{name: "a cold start that failed twice", retry: func(t *testing.T, bn *bundle) {
			bn.b.mu.Lock()
			bn.b.failNext = 2
			bn.b.mu.Unlock()
			for range 2 {
				if _, _, err := bn.p.Take(t.Context(), "t", "a", "job-0", sandbox.Spec{}); err == nil {
					t.Fatal("take succeeded with a failing backend")
				}
			}
		}},
		{name: "a start cut short twice", retry: func(t *testing.T, bn *bundle) {
			bn.b.mu.Lock()
			bn.b.gate = make(chan struct{}) // the starts wait for it until their context ends
			bn.b.mu.Unlock()
			ctx, cancel := context.WithCancel(t.Context())
			cancel()
			for range 2 {
				if _, _, err := bn.p.Take(ctx, "t", "a", "job-0", sandbox.Spec{}); err == nil {
					t.Fatal("take with its context cancelled succeeded")
				}
			}
			bn.b.mu.Lock()
			bn.b.gate = nil
			bn.b.mu.Unlock()
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			bn := setup(t, 4, twoWarm())
			tt.retry(t, bn)
			// One job of each: job-0, a's, tried before, and job-1, b's.
			checkPools(t, bn, []take{{"t", "a"}, {"t", "b"}}, 0, map[string]uint64{"t": 4}, 2, 2)
		})
	}
}

// TestMixForgetsCountedJobs: the jobs a mix knows as counted (TestMixCountsEachJobOnce) are
// forgotten once their counts weigh next to nothing: kept, every job of a long-lived worker
// stayed in its memory.
func TestMixForgetsCountedJobs(t *testing.T) {
	t.Parallel()
	bn := setup(t, 2, map[string]config.Profile{"a": warmProfile(config.Warm{})})
	for i := range 3 {
		sb, _ := bn.take(t, "a", fmt.Sprintf("job-%d", i))
		closeAll(t, sb)
	}
	bn.clock.advance(100 * time.Second) // ten half-lives
	sb, _ := bn.take(t, "a", "job-3")
	closeAll(t, sb)
	if got := bn.p.MixJobs("t"); got != 1 {
		t.Errorf("the mix remembers %d jobs, want the one of the last 100 s", got)
	}
	bn.p.Close()
}
