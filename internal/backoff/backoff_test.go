package backoff_test

import (
	"testing"
	"time"

	"github.com/boxcar-run/boxcar/internal/backoff"
)

func TestDelay(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		name  string
		round int
		want  time.Duration
	}{
		{"before the first round", 0, 250 * time.Millisecond},
		{"first round", 1, 250 * time.Millisecond},
		{"second round doubles", 2, 500 * time.Millisecond},
		{"fifth round", 5, 4 * time.Second},
		{"sixth round reaches the cap", 6, 5 * time.Second},
		{"far rounds stay at the cap", 1000, 5 * time.Second},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			if got := backoff.Delay(tt.round); got != tt.want {
				t.Errorf("Delay(%d) = %v, want %v", tt.round, got, tt.want)
			}
		})
	}
}
