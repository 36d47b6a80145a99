package queue_test

import (
	"testing"

	"github.com/boxcar-run/boxcar/internal/job"
	"github.com/boxcar-run/boxcar/internal/queue"
)

// Every writer of a dead letter for a job found ended (the runner, the sweep, setup) takes its
// reason and error from EndedLetter, so the letter tells the end its status tells.
func TestEndedLetter(t *testing.T) {
	t.Parallel()
	swept := queue.SweptCause("team-b").Error()
	for _, c := range []struct {
		name      string
		st        job.Status
		reason    string
		why       string
		hasLetter bool
	}{
		{"failed", job.Status{State: job.StateFailed, Error: "input missing"}, "failed", "input missing", true},
		{"rejected", job.Status{State: job.StateRejected, Error: "bad profile"}, "rejected", "bad profile", true},
		{"dead by the sweep", job.Status{State: job.StateDead, Error: swept}, queue.ReasonTenantRetired, swept, true},
		{"dead by another tenant's sweep", job.Status{State: job.StateDead, Error: queue.SweptCause("team-c").Error()}, "max_deliveries", queue.SweptCause("team-c").Error(), true},
		{"dead by setup", job.Status{State: job.StateDead, Error: queue.ReasonUnknownTenant + ": why"}, queue.ReasonUnknownTenant, "why", true},
		{"dead after its deliveries", job.Status{State: job.StateDead, Error: "timed out"}, "max_deliveries", "timed out", true},
		{"succeeded", job.Status{State: job.StateSucceeded}, "", "", false},
		{"cancelled", job.Status{State: job.StateCancelled}, "", "", false},
	} {
		reason, why, ok := queue.EndedLetter("team-b", c.st)
		if ok != c.hasLetter || reason != c.reason || (why == nil) == c.hasLetter || why != nil && why.Error() != c.why {
			t.Errorf("%s: EndedLetter = %q, %v, %v; want %q, %q, %v", c.name, reason, why, ok, c.reason, c.why, c.hasLetter)
		}
	}
}
