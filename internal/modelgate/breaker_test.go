package modelgate

import (
	"slices"
	"strings"
	"testing"
	"time"
)

// step is one event the breaker sees, at an offset from the test's start.
type step struct {
	at time.Duration
	// event is "ok", "fail", "final" (a failure the client does not retry), "busy" (a 429 or
	// one asking for a wait), each of a request
	// no job was named for, or followed by the job's name ("fail a"); "probe" (is one due?),
	// "probe ok", "probe fail", "probe gave up"; "judge ok", "judge fail", "judge gave up" (the
	// probe sent for the suspect).
	event string
	// retryAfter is what a failure asks for.
	retryAfter time.Duration
}

func TestBreakerTransitions(t *testing.T) {
	t.Parallel()
	const s = time.Second
	tests := []struct {
		name  string
		steps []step
		// want is the state after the last step; probeIn when the next probe is due from the
		// last step's time (checked when the breaker is open); changes the steps that
		// changed the state, by index.
		want    State
		probeIn time.Duration
		changes []int
	}{
		{name: "answers keep it closed", steps: []step{{0, "ok", 0}, {s, "ok", 0}}, want: Closed},
		{name: "failures below the threshold keep it closed",
			steps: []step{{0, "fail", 0}, {s, "fail", 0}}, want: Closed},
		{name: "an answer resets the run of failures",
			steps: []step{{0, "fail", 0}, {0, "fail", 0}, {0, "ok", 0}, {0, "fail", 0}, {0, "fail", 0}}, want: Closed},
		{name: "threshold failures in a row open it",
			steps: []step{{0, "fail", 0}, {0, "fail", 0}, {2 * s, "fail", 0}}, want: Open, probeIn: s, changes: []int{2}},
		{name: "no probe before its time",
			steps: []step{{0, "fail", 0}, {0, "fail", 0}, {0, "fail", 0}, {s / 2, "probe", 0}}, want: Open, probeIn: s / 2, changes: []int{2}},
		{name: "a probe is due after the backoff and makes it half-open",
			steps: []step{{0, "fail", 0}, {0, "fail", 0}, {0, "fail", 0}, {s, "probe", 0}}, want: HalfOpen, changes: []int{2}},
		{name: "an answered probe closes it",
			steps: []step{{0, "fail", 0}, {0, "fail", 0}, {0, "fail", 0}, {s, "probe", 0}, {s, "probe ok", 0}}, want: Closed, changes: []int{2, 4}},
		{name: "a failed probe reopens it with the backoff doubled",
			steps: []step{{0, "fail", 0}, {0, "fail", 0}, {0, "fail", 0}, {s, "probe", 0}, {s, "probe fail", 0}}, want: Open, probeIn: 2 * s, changes: []int{2}},
		{name: "the backoff doubles up to its maximum",
			steps: []step{{0, "fail", 0}, {0, "fail", 0}, {0, "fail", 0},
				{s, "probe", 0}, {s, "probe fail", 0}, {3 * s, "probe", 0}, {3 * s, "probe fail", 0},
				{7 * s, "probe", 0}, {7 * s, "probe fail", 0}, {15 * s, "probe", 0}, {15 * s, "probe fail", 0}},
			want: Open, probeIn: 10 * s, changes: []int{2}},
		{name: "Retry-After of a 429 that opens it delays the first probe",
			steps: []step{{0, "fail", 0}, {0, "fail", 0}, {0, "fail", 20 * s}}, want: Open, probeIn: 20 * s, changes: []int{2}},
		{name: "Retry-After longer than the maximum is cut to it",
			steps: []step{{0, "fail", 0}, {0, "fail", 0}, {0, "fail", time.Hour}}, want: Open, probeIn: time.Minute, changes: []int{2}},
		{name: "Retry-After of a failed probe delays the next",
			steps: []step{{0, "fail", 0}, {0, "fail", 0}, {0, "fail", 0}, {s, "probe", 0}, {s, "probe fail", 30 * s}},
			want:  Open, probeIn: 30 * s, changes: []int{2}},
		{name: "Retry-After of a request in flight when it opened moves the probe later",
			steps: []step{{0, "fail", 0}, {0, "fail", 0}, {0, "fail", 0}, {0, "fail", 5 * s}}, want: Open, probeIn: 5 * s, changes: []int{2}},
		{name: "a request in flight when it opened that fails does not move the probe",
			steps: []step{{0, "fail", 0}, {0, "fail", 0}, {0, "fail", 0}, {s / 2, "fail", 0}}, want: Open, probeIn: s / 2, changes: []int{2}},
		{name: "a request in flight when it opened that is answered closes it",
			steps: []step{{0, "fail", 0}, {0, "fail", 0}, {0, "fail", 0}, {0, "ok", 0}}, want: Closed, changes: []int{2, 3}},
		{name: "a probe whose caller gave up leaves the next one due at once",
			steps: []step{{0, "fail", 0}, {0, "fail", 0}, {0, "fail", 0}, {s, "probe", 0}, {s, "probe gave up", 0}}, want: Open, probeIn: 0, changes: []int{2}},
		{name: "an answered probe keeps the backoff: an endpoint that fails again is probed later",
			steps: []step{{0, "fail", 0}, {0, "fail", 0}, {0, "fail", 0}, {s, "probe", 0}, {s, "probe fail", 0},
				{3 * s, "probe", 0}, {3 * s, "probe ok", 0}, {3 * s, "fail", 0}, {3 * s, "fail", 0}, {3 * s, "fail", 0}},
			want: Open, probeIn: 2 * s, changes: []int{2, 6, 9}},
		{name: "an answered request resets the backoff",
			steps: []step{{0, "fail", 0}, {0, "fail", 0}, {0, "fail", 0}, {s, "probe", 0}, {s, "probe fail", 0},
				{3 * s, "probe", 0}, {3 * s, "probe ok", 0}, {3 * s, "ok", 0}, {3 * s, "fail", 0}, {3 * s, "fail", 0}, {3 * s, "fail", 0}},
			want: Open, probeIn: s, changes: []int{2, 6, 10}},
		{name: "a failure the client does not retry opens it at once, for its Retry-After",
			steps: []step{{0, "final", 10 * s}}, want: Open, probeIn: 10 * s, changes: []int{0}},
		{name: "a failure the client does not retry, asking for no wait, opens it for the backoff",
			steps: []step{{0, "fail", 0}, {0, "final", 0}}, want: Open, probeIn: s, changes: []int{1}},
		{name: "a failure the client does not retry while open moves the probe as any failure does",
			steps: []step{{0, "fail", 0}, {0, "fail", 0}, {0, "fail", 0}, {0, "final", 20 * s}}, want: Open, probeIn: 20 * s, changes: []int{2}},
		{name: "a probe answer while closed changes nothing",
			steps: []step{{0, "probe ok", 0}, {0, "probe fail", 0}}, want: Closed},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b := &breaker{threshold: 3, minBackoff: time.Second, maxBackoff: 10 * time.Second, maxWait: time.Minute}
			start := time.Date(2026, 12, 4, 12, 0, 0, 0, time.UTC)
			var changes []int
			var last time.Time
			for i, st := range tt.steps {
				now := start.Add(st.at)
				last = now
				changed := st.apply(t, b, now)
				if changed {
					changes = append(changes, i)
				}
			}
			if b.state != tt.want {
				t.Errorf("state %s, want %s", b.state, tt.want)
			}
			if tt.want == Open {
				if got := max(b.probeAt.Sub(last), 0); got != tt.probeIn {
					t.Errorf("next probe in %s, want %s", got, tt.probeIn)
				}
			}
			if !slices.Equal(changes, tt.changes) {
				t.Errorf("changes at steps %v, want %v", changes, tt.changes)
			}
		})
	}
}

// apply gives the breaker the step's event at now and reports whether its state changed.
func (st step) apply(t *testing.T, b *breaker, now time.Time) bool {
	t.Helper()
	fail := answer{failed: true, why: "HTTP 503", retryAfter: st.retryAfter}
	event, job, _ := strings.Cut(st.event, " ")
	switch event {
	case "ok":
		return b.record(now, answer{}, job)
	case "fail":
		return b.record(now, fail, job)
	case "final":
		fail.final = true
		return b.record(now, fail, job)
	case "busy":
		fail.busy = true
		return b.record(now, fail, job)
	case "judge":
		return st.judge(b, now, fail)
	}
	switch st.event {
	case "probe":
		b.probeDue(now) // half-open is no change callers hear of
		return false
	case "probe ok":
		return b.probed(now, answer{}, false)
	case "probe fail":
		return b.probed(now, fail, false)
	case "probe gave up":
		return b.probed(now, answer{}, true)
	}
	t.Fatalf("unknown event %q", st.event)
	return false
}

func (st step) judge(b *breaker, now time.Time, fail answer) bool {
	switch st.event {
	case "judge ok":
		return b.judged(now, answer{}, false)
	case "judge fail":
		return b.judged(now, fail, false)
	}
	return b.judged(now, answer{}, true)
}

// TestBreakerTellsOneJobFromAnOutage: a run of failures of one job's requests alone makes the
// job the suspect and leaves the breaker closed; the probe sent for it opens the breaker when
// it fails (an outage, on a worker running that job alone too) and forgets the run when it is
// answered (the job's own failures). Failures of two jobs, or of requests no job was named
// for, open it as they always did.
func TestBreakerTellsOneJobFromAnOutage(t *testing.T) {
	t.Parallel()
	const s = time.Second
	a3 := []step{{0, "fail a", 0}, {0, "fail a", 0}, {0, "fail a", 0}}
	tests := []struct {
		name    string
		steps   []step
		want    State
		suspect string
		changes []int
	}{
		{name: "one job's failures make it the suspect", steps: a3, want: Closed, suspect: "a"},
		{name: "fewer do not", steps: a3[:2], want: Closed},
		{name: "the probe answered: its own failures, forgotten",
			steps: append(a3[:3:3], step{s, "judge ok", 0}, step{s, "fail a", 0}, step{s, "fail b", 0}), want: Closed},
		{name: "a job's own failures, then another's before any request is answered: an outage",
			steps: append(a3[:3:3], step{s, "judge ok", 0}, step{s, "fail b", 0}, step{s, "fail b", 0}, step{s, "fail b", 0}),
			want:  Open, changes: []int{6}},
		{name: "an outage's answered probe is no answered request: the held job's failures alone open it again",
			steps: append(a3[:3:3], step{s, "judge ok", 0}, step{s, "fail b", 0}, step{s, "fail b", 0}, step{s, "fail b", 0},
				step{2 * s, "probe", 0}, step{2 * s, "probe ok", 0}, step{2 * s, "fail b", 0}, step{2 * s, "fail b", 0}, step{2 * s, "fail b", 0}),
			want: Open, changes: []int{6, 8, 11}},
		{name: "a job's own failures, a request answered, then another's: judged as ever",
			steps: append(a3[:3:3], step{s, "judge ok", 0}, step{s, "ok c", 0}, step{s, "fail b", 0}, step{s, "fail b", 0}, step{s, "fail b", 0}),
			want:  Closed, suspect: "b"},
		{name: "a job's own failures again: judged again",
			steps: append(a3[:3:3], step{s, "judge ok", 0}, step{s, "fail a", 0}, step{s, "fail a", 0}, step{s, "fail a", 0}),
			want:  Closed, suspect: "a"},
		{name: "the probe failed: an outage",
			steps: append(a3[:3:3], step{s, "judge fail", 0}), want: Open, changes: []int{3}},
		{name: "the probe's caller gave up: still the suspect",
			steps: append(a3[:3:3], step{s, "judge gave up", 0}), want: Closed, suspect: "a"},
		{name: "another job's request answered: its own failures",
			steps: append(a3[:3:3], step{0, "ok b", 0}), want: Closed},
		{name: "another job's failure with the suspect's: an outage",
			steps: append(a3[:3:3], step{0, "fail b", 0}), want: Open, changes: []int{3}},
		{name: "two jobs' failures open it at the threshold",
			steps: []step{{0, "fail a", 0}, {0, "fail b", 0}, {0, "fail a", 0}}, want: Open, changes: []int{2}},
		{name: "a request no job was named for counts as another job's",
			steps: []step{{0, "fail a", 0}, {0, "fail a", 0}, {0, "fail", 0}}, want: Open, changes: []int{2}},
		{name: "one job's 429s or failures asking for a wait speak of the endpoint: they open it",
			steps: []step{{0, "fail a", 0}, {0, "busy a", 0}, {0, "fail a", 0}}, want: Open, changes: []int{2}},
		{name: "one job's failure the client does not retry opens it at once",
			steps: []step{{0, "final a", 0}}, want: Open, changes: []int{0}},
		{name: "an answer starts a new run",
			steps: []step{{0, "fail b", 0}, {0, "ok c", 0}, {0, "fail a", 0}, {0, "fail a", 0}, {0, "fail a", 0}}, want: Closed, suspect: "a"},
		{name: "a probe for a suspect once the breaker opened changes nothing",
			steps: append(a3[:3:3], step{0, "fail b", 0}, step{s, "judge ok", 0}), want: Open, changes: []int{3}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b := &breaker{threshold: 3, minBackoff: time.Second, maxBackoff: 10 * time.Second, maxWait: time.Minute}
			start := time.Date(2026, 12, 7, 12, 0, 0, 0, time.UTC)
			var changes []int
			for i, st := range tt.steps {
				if st.apply(t, b, start.Add(st.at)) {
					changes = append(changes, i)
				}
			}
			if b.state != tt.want || b.suspect != tt.suspect {
				t.Errorf("state %s, suspect %q; want %s, %q", b.state, b.suspect, tt.want, tt.suspect)
			}
			if !slices.Equal(changes, tt.changes) {
				t.Errorf("changes at steps %v, want %v", changes, tt.changes)
			}
		})
	}
}

// TestBreakerKeepsTheRetryAfter: what the endpoint last asked for (Retry-After, bounded by
// maxWait), from its answer, whatever the backoff; gone once it answers. The runner delays a
// job's next delivery by it (Gate.RetryAfter).
func TestBreakerKeepsTheRetryAfter(t *testing.T) {
	t.Parallel()
	const s = time.Second
	tests := []struct {
		name    string
		steps   []step
		retryIn time.Duration // from the last step's time
	}{
		{name: "none asked for", steps: []step{{0, "fail", 0}, {0, "fail", 0}, {0, "fail", 0}}},
		{name: "a final failure's, counted from its answer", steps: []step{{0, "final", 50 * s}, {20 * s, "probe", 0}}, retryIn: 30 * s},
		{name: "bounded by maxWait", steps: []step{{0, "final", time.Hour}}, retryIn: time.Minute},
		{name: "one below the threshold's too", steps: []step{{0, "fail", 40 * s}}, retryIn: 40 * s},
		{name: "a shorter one later keeps the longer", steps: []step{{0, "final", 50 * s}, {10 * s, "fail", 5 * s}}, retryIn: 40 * s},
		{name: "a failed probe's", steps: []step{{0, "final", 0}, {s, "probe", 0}, {s, "probe fail", 30 * s}}, retryIn: 30 * s},
		{name: "past: none", steps: []step{{0, "final", 10 * s}, {20 * s, "probe", 0}}},
		{name: "an answered probe forgets it", steps: []step{{0, "final", 50 * s}, {50 * s, "probe", 0}, {50 * s, "probe ok", 0}, {51 * s, "fail", 0}}},
		{name: "an answered request forgets it", steps: []step{{0, "fail", 50 * s}, {s, "ok", 0}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b := &breaker{threshold: 3, minBackoff: time.Second, maxBackoff: 10 * time.Second, maxWait: time.Minute}
			start := time.Date(2026, 12, 4, 12, 0, 0, 0, time.UTC)
			var last time.Time
			for _, st := range tt.steps {
				last = start.Add(st.at)
				st.apply(t, b, last)
			}
			got := time.Duration(0)
			if !b.retryAt.IsZero() {
				got = max(b.retryAt.Sub(last), 0)
			}
			if got != tt.retryIn {
				t.Errorf("retry in %s, want %s", got, tt.retryIn)
			}
		})
	}
}
