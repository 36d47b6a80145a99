package pool_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/boxcar-run/boxcar/internal/config"
)

// TestWarmPoolsFollowTheirProfilesPart: the lag names no profile, so with two warm profiles
// each pool follows its profile's part of it, as the recent jobs split it; with nothing recent
// (or forgotten) each follows the whole, and the slots are shared as before.
func TestWarmPoolsFollowTheirProfilesPart(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name         string
		takes        map[string]int // recent jobs of each profile ("c" has no pool)
		forget       time.Duration  // how long ago those jobs were
		wantA, wantB int
	}{
		{name: "no jobs yet: both follow the whole lag", wantA: 2, wantB: 2},
		{name: "only a's jobs", takes: map[string]int{"a": 4}, wantA: 4, wantB: 0},
		{name: "three of a's to one of b's", takes: map[string]int{"a": 3, "b": 1}, wantA: 3, wantB: 1},
		{name: "an unpooled profile's jobs take their part", takes: map[string]int{"a": 2, "c": 2}, wantA: 2, wantB: 0},
		{name: "a mix long gone is forgotten", takes: map[string]int{"a": 4}, forget: 5 * time.Minute, wantA: 2, wantB: 2},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			bn := setup(t, 4, map[string]config.Profile{
				"a": warmProfile(config.Warm{}),
				"b": warmProfile(config.Warm{}),
			})
			for profile, n := range tt.takes {
				for i := range n {
					sb, _ := bn.take(t, profile, fmt.Sprintf("%s-%d", profile, i))
					closeAll(t, sb)
				}
			}
			bn.p.Settle()
			bn.clock.advance(tt.forget)
			for _, name := range []string{"a", "b"} {
				bn.lag.set(name, 4, 0) // the consumer's lag: the same for every profile
			}
			bn.reconcile(t)
			if a, b := bn.size("a"), bn.size("b"); a != tt.wantA || b != tt.wantB {
				t.Errorf("pools a=%d b=%d, want %d and %d", a, b, tt.wantA, tt.wantB)
			}
			bn.p.Close()
		})
	}
}
