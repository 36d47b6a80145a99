package modelgate

import (
	"fmt"
	"time"
)

// State is the breaker's state.
type State int

// States of the breaker.
const (
	// Closed: the endpoint answers; requests pass.
	Closed State = iota
	// Open: the endpoint stopped answering; requests are refused until the next probe.
	Open
	// HalfOpen: one probe is on its way; requests are still refused.
	HalfOpen
)

func (s State) String() string {
	switch s {
	case Closed:
		return "closed"
	case Open:
		return "open"
	case HalfOpen:
		return "half-open"
	}
	return fmt.Sprintf("State(%d)", int(s))
}

// answer is what one request to the endpoint came back with, as the breaker sees it.
type answer struct {
	// failed: no response at all, or 408, 409, 429 or 5xx: what the agent calls the endpoint
	// being unavailable.
	failed bool
	// retryAfter is the delay the endpoint asked for (Retry-After), zero when it named none.
	retryAfter time.Duration
	// final: a failure the client does not retry (x-should-retry: false, or a Retry-After
	// longer than it waits): the endpoint says it is down for now, and the breaker opens at
	// once. Counted as one of a run, the job whose request it was would end without a wait.
	final bool
	// busy: a 429, or a failure asking for a wait (Retry-After): the endpoint speaks of its
	// load, not of the request, so it counts as no one job's own.
	busy bool
	// why says what failed in a few words ("HTTP 503", "no response"), for /readyz and logs.
	why string
}

// breaker is the state machine, apart from time and locks so that its transitions are a
// table test: record takes the answer of a request, probeDue and probed the half-open probe.
type breaker struct {
	threshold  int
	minBackoff time.Duration
	maxBackoff time.Duration
	maxWait    time.Duration // the longest Retry-After honoured

	state State
	// failures is the run of failed requests since the last answer. runJob is the job whose
	// request failed first since a request was last answered, and severalJobs whether
	// another's failed since, or one no job was named for (WithJob), which may be anyone's: an
	// answered probe (one that finds one job's failures its own, or closes the breaker)
	// forgets the run but not whose it was, so that a second job failing before any request
	// is answered opens the breaker, and so do its failures alone after a probe closed it (an
	// endpoint that answers probes and fails every chat request, on a worker running one job
	// at a time).
	failures    int
	runJob      string
	severalJobs bool
	// suspect is the job whose failures alone made a run of threshold while the breaker was
	// closed: the probe judges them (judged), and the breaker stays closed meanwhile.
	suspect string
	// level is the number of failed probes since the endpoint last answered a request: the
	// next probe waits minBackoff << level. A probe that succeeds does not reset it, so an
	// endpoint that answers probes but fails every request is probed less and less often.
	level int
	// probeAt is when an open breaker probes next.
	probeAt time.Time
	// downSince is when the breaker opened; why the last failure.
	downSince time.Time
	why       string
	// retryAt is when the latest Retry-After of a failed answer (up to maxWait) runs out;
	// zero once an answer came since.
	retryAt time.Time
}

// record takes the answer of a request job sent ("": a job not named) that passed the breaker
// and reports whether the state changed. Requests that were in flight when it opened may still
// answer: an answer closes it (the endpoint works), a failure changes nothing. A run of
// threshold failures opens it when they are of two jobs or more; one job's alone make it the
// suspect, whom the probe judges: one job's context the server fails on is no outage.
func (b *breaker) record(now time.Time, a answer, job string) bool {
	if !a.failed {
		b.level = 0
		b.answered()
		return b.close()
	}
	b.why = a.why
	b.noteRetryAfter(now, a.retryAfter)
	if b.state != Closed {
		// Only a Retry-After moves the probe: the backoff was set when the breaker opened.
		if at := now.Add(min(a.retryAfter, b.maxWait)); at.After(b.probeAt) {
			b.probeAt = at
		}
		return false
	}
	if a.busy {
		job = ""
	}
	b.count(job)
	switch {
	case b.failures < b.threshold && !a.final:
		return false
	case !b.severalJobs && !a.final:
		b.suspect = b.runJob
		return false
	}
	b.open(now, a.retryAfter)
	return true
}

// count adds a failure of job's to the run.
func (b *breaker) count(job string) {
	if b.runJob == "" && !b.severalJobs {
		b.runJob = job
	}
	b.failures++
	b.severalJobs = b.severalJobs || job == "" || job != b.runJob
}

// answered forgets the run of failures, its suspect and the Retry-After: the endpoint answered.
func (b *breaker) answered() {
	b.probeAnswered()
	b.runJob, b.severalJobs = "", false
}

// probeAnswered forgets the run of failures, its suspect and the Retry-After, but not whose
// the failures were (runJob, severalJobs): GET /models answered says little of chat requests,
// and an endpoint that answers it and fails every chat request must hold the job whose
// failures opened the breaker with another's, not fail it as its own once the probe closes it.
func (b *breaker) probeAnswered() {
	b.failures, b.suspect, b.retryAt = 0, "", time.Time{}
}

func (b *breaker) open(now time.Time, retryAfter time.Duration) {
	b.state, b.downSince, b.suspect = Open, now, ""
	b.probeAt = b.next(now, retryAfter)
}

// suspects reports whether job is the suspect whose failures the probe is to judge.
func (b *breaker) suspects(job string) bool {
	return b.state == Closed && job != "" && b.suspect == job
}

// judged takes the answer of the probe sent for the suspect and reports whether the state
// changed: a failed probe says the endpoint is down and opens the breaker; an answered one
// says the failures were the suspect's own, and the run is forgotten (but whose it was:
// count). A probe whose caller gave up, or that a change while it was out made moot, changes
// nothing.
func (b *breaker) judged(now time.Time, a answer, gaveUp bool) bool {
	if gaveUp || b.state != Closed || b.suspect == "" {
		return false
	}
	if !a.failed {
		b.probeAnswered()
		return false
	}
	b.why = a.why
	b.noteRetryAfter(now, a.retryAfter)
	b.open(now, a.retryAfter)
	return true
}

// probeDue turns an open breaker whose probe time has come half-open and reports whether the
// caller is to send the probe.
func (b *breaker) probeDue(now time.Time) bool {
	if b.state != Open || now.Before(b.probeAt) {
		return false
	}
	b.state = HalfOpen
	return true
}

// probed takes the probe's answer and reports whether the state changed. An answered probe
// closes the breaker and forgets the run but not whose it was (probeAnswered). A probe that
// ended without an answer because its caller gave up (gaveUp) leaves the breaker open with the
// probe due at once, for the next caller.
func (b *breaker) probed(now time.Time, a answer, gaveUp bool) bool {
	if b.state != HalfOpen {
		return false
	}
	switch {
	case gaveUp:
		b.state = Open
		return false
	case !a.failed:
		b.probeAnswered()
		return b.close()
	}
	b.state, b.why = Open, a.why
	b.noteRetryAfter(now, a.retryAfter)
	b.level++
	b.probeAt = b.next(now, a.retryAfter)
	return false
}

// next is when to probe after a failure at now: after the backoff of the current level or
// the endpoint's Retry-After (up to maxWait), whichever is later.
func (b *breaker) next(now time.Time, retryAfter time.Duration) time.Time {
	return now.Add(max(b.backoff(), min(retryAfter, b.maxWait)))
}

// noteRetryAfter keeps the latest time a failed answer at now asked to be left alone until
// (retryAfter, up to maxWait).
func (b *breaker) noteRetryAfter(now time.Time, retryAfter time.Duration) {
	if retryAfter <= 0 {
		return
	}
	if at := now.Add(min(retryAfter, b.maxWait)); at.After(b.retryAt) {
		b.retryAt = at
	}
}

func (b *breaker) backoff() time.Duration {
	return min(b.minBackoff<<min(b.level, 20), b.maxBackoff)
}

func (b *breaker) close() bool {
	if b.state == Closed {
		return false
	}
	b.state = Closed
	return true
}
