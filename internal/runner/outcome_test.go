package runner

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/boxcar-run/boxcar/internal/job"
	"github.com/boxcar-run/boxcar/internal/queue"
)

// TestDecide is the whole table of a job's fate: every ending, on a delivery that the queue
// will repeat and on the last one.
func TestDecide(t *testing.T) {
	t.Parallel()
	perm := queue.Permanent("input_missing", errors.New("input gone"))
	transient := errors.New("store: connection refused")
	tests := []struct {
		name string
		o    outcome
		last bool
		want decision
	}{
		{"succeeded", outcome{end: endSucceeded}, false, decision{action: ackJob, state: job.StateSucceeded}},
		{"succeeded, last", outcome{end: endSucceeded}, true, decision{action: ackJob, state: job.StateSucceeded}},
		{"capped", outcome{end: endCapped, cap: "max_turns"}, false, decision{action: ackJob, state: job.StateCapped, capHit: "max_turns"}},
		{"capped, last", outcome{end: endCapped, cap: "max_turns"}, true, decision{action: ackJob, state: job.StateCapped, capHit: "max_turns"}},
		{"failed", outcome{end: endFailed, err: perm}, false, decision{action: termJob, state: job.StateFailed, reason: "input_missing"}},
		{"failed, last", outcome{end: endFailed, err: perm}, true, decision{action: termJob, state: job.StateFailed, reason: "input_missing"}},
		{"failed without a reason", outcome{end: endFailed, err: transient}, false, decision{action: termJob, state: job.StateFailed, reason: "failed"}},
		{"rejected", outcome{end: endRejected, err: queue.Permanent("invalid_job", transient)}, false, decision{action: termJob, state: job.StateRejected, reason: "invalid_job"}},
		{"rejected, last", outcome{end: endRejected, err: queue.Permanent("unknown_profile", transient)}, true, decision{action: termJob, state: job.StateRejected, reason: "unknown_profile"}},
		{"transient", outcome{end: endTransient, err: transient}, false, decision{action: nakLater, state: job.StateRetrying}},
		{"transient, last", outcome{end: endTransient, err: transient}, true, decision{action: termJob, state: job.StateDead, reason: "max_deliveries"}},
		{"transient with a delay", outcome{end: endTransient, err: queue.RetryAfter(time.Minute, transient)}, false, decision{action: nakLater, state: job.StateRetrying}},
		{"transient with a delay, last", outcome{end: endTransient, err: queue.RetryAfter(time.Minute, transient)}, true, decision{action: termJob, state: job.StateDead, reason: "max_deliveries"}},
		{"cancelled", outcome{end: endCancelled, err: errCancelled}, false, decision{action: ackJob, state: job.StateCancelled}},
		{"cancelled, last", outcome{end: endCancelled, err: errCancelled}, true, decision{action: ackJob, state: job.StateCancelled}},
		{"interrupted", outcome{end: endInterrupted, err: errShutdown}, false, decision{action: nakNow, state: job.StateInterrupted}},
		{"interrupted, last", outcome{end: endInterrupted, err: errShutdown}, true, decision{action: nakNow, state: job.StateInterrupted}},
		{"done elsewhere", outcome{end: endDone}, false, decision{action: ackJob}},
		{"done elsewhere, last", outcome{end: endDone}, true, decision{action: ackJob}},
		{"lease lost", outcome{end: endLeaseLost, err: errLeaseLost}, false, decision{action: leaveJob, stale: true}},
		{"lease lost, last", outcome{end: endLeaseLost, err: errLeaseLost}, true, decision{action: leaveJob, stale: true}},
		{"committed as failed", outcome{end: endDeadLetter, err: perm}, false, decision{action: termJob, reason: "input_missing"}},
		{"committed as dead, last", outcome{end: endDeadLetter, err: queue.Permanent("max_deliveries", transient)}, true, decision{action: termJob, reason: "max_deliveries"}},
		{"committed as dead here", outcome{end: endDeadLetter, err: queue.Permanent("max_deliveries", transient), committed: true, state: job.StateDead}, false, decision{action: termJob, reason: "max_deliveries", ended: job.StateDead}},
		{"committed as dead here, last", outcome{end: endDeadLetter, err: queue.Permanent("max_deliveries", transient), committed: true, state: job.StateDead}, true, decision{action: termJob, reason: "max_deliveries", ended: job.StateDead}},
		{"rejected, committed here", outcome{end: endDeadLetter, err: queue.Permanent("unknown_profile", transient), committed: true, state: job.StateRejected}, false, decision{action: termJob, reason: "unknown_profile", ended: job.StateRejected}},
		{"cancelled before it ran, committed here", outcome{end: endDone, committed: true, state: job.StateCancelled}, true, decision{action: ackJob, ended: job.StateCancelled}},
		{"undecided", outcome{end: endUndecided, err: transient}, false, decision{action: nakLater, waiting: true}},
		{"undecided, last", outcome{end: endUndecided, err: transient}, true, decision{action: nakLater, waiting: true}},
		{"left to a peer", outcome{end: endLeftToPeer, err: perm}, false, decision{action: nakLater, waiting: true}},
		{"left to a peer, last", outcome{end: endLeftToPeer, err: perm}, true, decision{action: nakLater, waiting: true}},
		{"panicked in its end", outcome{end: endPanickedInEnd, err: queue.Permanent("worker_panicked", transient)}, false, decision{action: nakLater, waiting: true}},
		{"panicked in its end, last", outcome{end: endPanickedInEnd, err: queue.Permanent("worker_panicked", transient)}, true, decision{action: termJob, state: job.StateFailed, reason: "worker_panicked"}},
	}
	covered := map[ending]map[bool]bool{}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := decide(tt.o, tt.last); got != tt.want {
				t.Errorf("decide(%s, last=%t) = %+v, want %+v", tt.o.end, tt.last, got, tt.want)
			}
		})
		if covered[tt.o.end] == nil {
			covered[tt.o.end] = map[bool]bool{}
		}
		covered[tt.o.end][tt.last] = true
	}
	for e := range endingNames {
		if !covered[e][false] || !covered[e][true] {
			t.Errorf("ending %s is not covered on both a repeated and the last delivery", e)
		}
	}
}

// TestNakDelay: a job handed back waits its backoff, doubling with each delivery up to 5
// minutes, or what its fault asks for (queue.RetryAfter) when that is longer: a model
// endpoint's Retry-After of 4 minutes is not cut to the 5s of a first retry, and one of 3s
// does not shorten a backoff grown to 20s.
func TestNakDelay(t *testing.T) {
	t.Parallel()
	const base = 5 * time.Second
	plain := errors.New("transient")
	tests := []struct {
		name    string
		attempt int
		err     error
		want    time.Duration
	}{
		{name: "first retry", attempt: 1, err: plain, want: base},
		{name: "third retry", attempt: 3, err: plain, want: 4 * base},
		{name: "backoff bounded", attempt: 30, err: plain, want: 5 * time.Minute},
		{name: "a longer delay asked for", attempt: 1, err: queue.RetryAfter(4*time.Minute, plain), want: 4 * time.Minute},
		{name: "a shorter delay asked for", attempt: 3, err: queue.RetryAfter(3*time.Second, plain), want: 4 * base},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := nakDelay(base, tt.attempt, tt.err); got != tt.want {
				t.Errorf("nakDelay(%s, %d, %v) = %s, want %s", base, tt.attempt, tt.err, got, tt.want)
			}
		})
	}
}

// TestDecideCommitsExactlyTheTerminalEndings: a run is committed when decide gives a terminal
// state, so only the last try of a failing job keeps its transcript, and nothing that will be
// retried or that ended elsewhere writes a manifest. The one terminal end with nothing left to
// commit is that of a commit of the end that panicked on the last delivery: it was the commit.
func TestDecideCommitsExactlyTheTerminalEndings(t *testing.T) {
	t.Parallel()
	for e := range endingNames {
		for _, last := range []bool{false, true} {
			d := decide(outcome{end: e, err: errors.New("x")}, last)
			want := e == endSucceeded || e == endCapped || e == endFailed || e == endRejected || e == endCancelled || (e == endTransient || e == endPanickedInEnd) && last
			if got := d.state.Terminal(); got != want {
				t.Errorf("%s, last=%t: terminal state %q, want terminal=%t", e, last, d.state, want)
			}
			if (d.action == termJob) != (d.reason != "") {
				t.Errorf("%s, last=%t: action %s with reason %q; a dead letter always has a reason", e, last, d.action, d.reason)
			}
		}
	}
}

func TestWithDroppedReport(t *testing.T) {
	t.Parallel()
	dropped := queue.Permanent("report_too_large", errors.New("too large"))
	cause := queue.Permanent("model_rejected", errors.New("401"))
	tests := []struct {
		name string
		o    outcome
		want ending
		err  error
	}{
		{"succeeded fails", outcome{end: endSucceeded}, endFailed, dropped},
		{"capped fails", outcome{end: endCapped, cap: "max_turns"}, endFailed, dropped},
		{"failed keeps its cause", outcome{end: endFailed, err: cause}, endFailed, cause},
		{"dead keeps its cause", outcome{end: endTransient, err: cause}, endTransient, cause},
		{"cancelled stays cancelled", outcome{end: endCancelled, err: errCancelled}, endCancelled, errCancelled},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := tt.o.withDroppedReport(dropped)
			if got.end != tt.want || !errors.Is(got.err, tt.err) {
				t.Errorf("withDroppedReport = %s (%v), want %s (%v)", got.end, got.err, tt.want, tt.err)
			}
			if same := tt.o.withDroppedReport(nil); fmt.Sprint(same) != fmt.Sprint(tt.o) {
				t.Errorf("without a dropped report the outcome changed: %+v", same)
			}
		})
	}
}

// TestErrorText: an error's text that is the tenant's own is kept whole up to maxErrorText, and past it cut to a head of
// whole characters with what was cut counted. In invalid UTF-8 the cut stays at the bound: it
// walked back to the last byte that starts a character, which in a run of stray bytes was the
// text's first, and kept nothing.
func TestErrorText(t *testing.T) {
	t.Parallel()
	keep := maxErrorText - 32
	tests := []struct {
		name, in, wantHead string
	}{
		{name: "fits", in: "store: connection refused", wantHead: "store: connection refused"},
		{name: "exactly the bound", in: strings.Repeat("a", maxErrorText), wantHead: strings.Repeat("a", maxErrorText)},
		{name: "a character across the cut", in: strings.Repeat("a", keep-1) + "€" + strings.Repeat("b", 100), wantHead: strings.Repeat("a", keep-1) + "…["},
		{name: "stray bytes", in: "a" + strings.Repeat("\x80", maxErrorText), wantHead: "a" + strings.Repeat("\x80", keep-1) + "…["},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got := errorText(toldError{tt.in})
			if !strings.HasPrefix(got, tt.wantHead) || len(got) > maxErrorText {
				t.Errorf("errorText = %.60q… (%d bytes); want it to begin %.60q…, at most %d bytes", got, len(got), tt.wantHead, maxErrorText)
			}
			if cut := len(tt.in) - strings.Index(got, "…["); len(got) > len(tt.in) || (got != tt.in && !strings.HasSuffix(got, fmt.Sprintf("…[%d bytes cut]", cut))) {
				t.Errorf("errorText = %.60q…%q; want the bytes cut counted", got, got[max(len(got)-24, 0):])
			}
		})
	}
}
