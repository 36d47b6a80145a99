package runner

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/boxcar-run/boxcar/internal/agent"
	"github.com/boxcar-run/boxcar/internal/config"
	"github.com/boxcar-run/boxcar/internal/egress"
	"github.com/boxcar-run/boxcar/internal/job"
	"github.com/boxcar-run/boxcar/internal/provenance"
	"github.com/boxcar-run/boxcar/internal/queue"
	"github.com/boxcar-run/boxcar/internal/sandbox"
	"github.com/boxcar-run/boxcar/internal/store"
)

// stage is one step of an attempt (process). The same error means different things in
// different stages: a missing object is "not committed yet" while claiming, and a lost input
// while preparing.
type stage int

const (
	// stageAdmit reads the message as a job of a profile this worker defines.
	stageAdmit stage = iota + 1
	// stageClaim checks that no run is committed and records the job as running.
	stageClaim
	// stagePrepare starts the sandbox and streams the inputs into it.
	stagePrepare
	// stageRun is the agent loop.
	stageRun
	// stageCollect reads the report and lists the artifacts.
	stageCollect
	// stageCommit uploads the run and commits its manifest.
	stageCommit
	// stageEnd ends a job as its committed manifest says (commitEnd, endCommitted).
	stageEnd
)

var stageNames = map[stage]string{
	stageAdmit: "admit", stageClaim: "claim", stagePrepare: "prepare", stageRun: "run",
	stageCollect: "collect", stageCommit: "commit", stageEnd: "end",
}

func (s stage) String() string { return stageNames[s] }

// Errors the stages return for classify to turn into an ending.
var (
	// errJobEnded: the job's status is already final (endedError says how), and no run of it
	// is committed.
	errJobEnded = errors.New("job already ended")
	// errExhausted: the job used up its deliveries before this one (queue.Delivery.Exhausted).
	errExhausted = errors.New("no worker finished the job")
	// errUndecided: the job's end cannot be decided now (its committed manifest could not be
	// read, or its end could not be committed).
	errUndecided = errors.New("end undecided")
	// errInputTooLarge: the inputs do not fit the profile's max_input_bytes.
	errInputTooLarge = errors.New("input too large for the profile")
	// errInputMismatch: an input is not the bytes its digest and size name.
	errInputMismatch = errors.New("input does not match its digest or size")
	// errAgentPanicked: the agent panicked on the job, a bug in the worker that the same job
	// would likely meet again (a hostile answer of its model, say): it fails, not retried.
	errAgentPanicked = errors.New("the agent panicked (a bug in the worker; its log has the stack)")
)

// capError is a run a cap stopped (agent.OutcomeCapped): not a fault, but an end of its own.
type capError struct{ cap string }

func (e *capError) Error() string { return "stopped by the cap " + e.cap }

// committedError is a job whose run is committed (by this delivery or another): it ends as the
// manifest says.
type committedError struct{ out provenance.Outcome }

func (e *committedError) Error() string {
	return fmt.Sprintf("the job is committed as %s", e.out.State)
}

// failed reports whether the committed end is one with a dead letter.
func (e *committedError) failed() bool {
	_, lettered := letterReasons[e.out.State]
	return lettered
}

// letterReasons are the ends that have a dead letter, each with the letter's reason when
// nothing more precise names one (as decide gives it).
var letterReasons = map[job.State]string{job.StateFailed: "failed", job.StateRejected: "rejected", job.StateDead: "max_deliveries"}

// endedError is a job whose status the claim found final, with no run committed: a delivery
// ended it without a manifest, or `worker setup` retiring its tenant did (queue's endJob), and
// stopped before its dead letter, which this delivery then writes.
type endedError struct {
	tenant string
	st     job.Status
}

func (e *endedError) Error() string { return fmt.Sprintf("%v as %s", errJobEnded, e.st.State) }
func (e *endedError) Unwrap() error { return errJobEnded }

// lettered reports whether the job ended with a dead letter.
func (e *endedError) lettered() bool {
	_, ok := letterReasons[e.st.State]
	return ok
}

// failureMode is one row of the table classify reads: where it applies, what it matches and
// what ending it gives.
type failureMode struct {
	name string
	// in lists the stages the row applies to; empty: every stage.
	in []stage
	// when matches the stage's error and the cause of the attempt's context (nil while it
	// runs).
	when func(err, cause error) bool
	end  ending
	// reason, for endFailed and endRejected, is the dead letter's reason (queue.Permanent).
	reason string
	// retryAfter, for endTransient, is the least delay before the next delivery
	// (queue.RetryAfter): the backoff when that is longer.
	retryAfter time.Duration
	// build makes the outcome when the row needs more than end, reason and retryAfter.
	build func(err, cause error) outcome
}

// failureModes is every way an attempt's stage can end, first match wins. A new failure mode
// is a new row.
var failureModes = []failureMode{
	// Ends decided elsewhere come first: whatever else happened, this attempt must not act. A
	// lease lost is the stage's error (the commit found a later attempt) or the cause of the
	// attempt's context (a status write found one: writeStatus).
	{name: "lease lost", when: errOrCauseIs(errLeaseLost), build: leaseLostOutcome},
	{name: "job ended elsewhere", in: []stage{stageClaim}, when: endedElsewhere(false), end: endDone,
		build: func(error, error) outcome { return outcome{end: endDone} }},
	{name: "committed", in: []stage{stageClaim, stageEnd}, when: committed(false), build: committedOutcome},
	{name: "cancelled before it started", in: []stage{stageClaim}, when: errIs(errCancelled), end: endCancelled},

	// The commit of the end panicked (survive in end), whatever else stopped the attempt.
	{name: "end panicked", in: []stage{stageEnd}, when: errIs(errEndPanicked), end: endPanickedInEnd, reason: "worker_panicked"},
	// The attempt's context ended: a goroutine of the attempt panicked (goGuarded), a cancel
	// or a shutdown, whatever the stage was doing.
	{name: "worker panicked beside the stage", when: causeIs(errWorkerPanicked), build: func(_, cause error) outcome {
		return outcome{end: endFailed, err: queue.Permanent("worker_panicked", cause)}
	}},
	{name: "cancelled", when: causeIs(errCancelled), build: causeOutcome(endCancelled)},
	{name: "interrupted", when: anyCause, build: causeOutcome(endInterrupted)},

	{name: "committed with a dead letter", in: []stage{stageClaim, stageEnd}, when: committed(true), build: committedOutcome},
	{name: "ended elsewhere with a dead letter", in: []stage{stageClaim}, when: endedElsewhere(true), build: endedOutcome},
	// An end that cannot be decided now is tried again by a later delivery, recording nothing.
	{name: "end undecided", when: errIs(errUndecided), end: endUndecided},
	{name: "end failed", in: []stage{stageEnd}, when: anyErr, end: endUndecided},
	{name: "capped", in: []stage{stageRun}, when: isCap, build: func(err, _ error) outcome {
		var c *capError
		errors.As(err, &c)
		return outcome{end: endCapped, cap: c.cap}
	}},
	{name: "tenant budget exhausted", in: []stage{stageRun}, when: errIs(errBudgetExhausted), build: func(err, _ error) outcome {
		return outcome{end: endCapped, cap: capBudgetExhausted, err: err}
	}},
	{name: "exhausted", in: []stage{stageClaim}, when: errIs(errExhausted), end: endTransient},
	// The sandbox was evicted for passing its disk bound: the job filled it.
	{name: "sandbox lost over its disk bound", in: []stage{stageRun, stageCollect}, when: lostOverDisk, build: func(err, _ error) outcome {
		return outcome{end: endCapped, cap: capDisk, err: err}
	}},

	// Permanent faults of the job: retrying cannot fix them.
	{name: "invalid job", in: []stage{stageAdmit}, when: errIs(job.ErrInvalid), end: endRejected, reason: "invalid_job"},
	{name: "unknown profile", in: []stage{stageAdmit}, when: errIs(config.ErrUnknownProfile), end: endRejected, reason: "unknown_profile"},
	{name: "network wider than the profile's", in: []stage{stageAdmit}, when: errIs(egress.ErrWiden), end: endRejected, reason: "network_not_allowed"},
	{name: "backend gives no egress", in: []stage{stagePrepare}, when: errIs(sandbox.ErrNoEgress), end: endFailed, reason: "invalid_profile"},
	{name: "profile not granted", in: []stage{stageAdmit}, when: errIs(config.ErrProfileNotGranted), end: endRejected, reason: "profile_not_granted"},
	// At the claim its write probe, at the commit any write of the run: no manifest can be
	// written there, and the job ends without one (see end.go); unless an earlier put of the
	// manifest may yet land (putSettled), which leaves it to the next delivery.
	{name: "store refuses the tenant's writes", in: []stage{stageClaim, stageCommit}, when: refusedNotMaybe, end: endFailed, reason: "store_write_refused"},
	{name: "input outside tenant", in: []stage{stagePrepare}, when: errIs(errInputOutsideTenant), end: endFailed, reason: "input_outside_tenant"},
	{name: "input too large", in: []stage{stageAdmit}, when: errIs(errInputTooLarge), end: endFailed, reason: "input_too_large"},
	{name: "inputs fill the workdir", in: []stage{stagePrepare}, when: errIs(sandbox.ErrDiskFull), end: endFailed, reason: "input_too_large"},
	{name: "input missing", in: []stage{stagePrepare}, when: errIs(store.ErrNotFound), end: endFailed, reason: "input_missing"},
	{name: "input refused", in: []stage{stagePrepare}, when: errIs(store.ErrReadRefused), end: endFailed, reason: "input_refused"},
	{name: "input digest mismatch", in: []stage{stagePrepare}, when: errIs(errInputMismatch), end: endFailed, reason: "input_digest_mismatch"},
	{name: "model refused credentials", in: []stage{stageRun}, when: errIs(agent.ErrModelAuth), end: endFailed, reason: "model_rejected"},
	{name: "model rejected the request", in: []stage{stageRun}, when: errIs(agent.ErrModelRequest), end: endFailed, reason: "model_rejected"},
	{name: "profile the agent refuses", in: []stage{stageRun}, when: errIs(agent.ErrInvalidRequest), end: endFailed, reason: "invalid_profile"},
	{name: "agent panicked", in: []stage{stageRun}, when: errIs(errAgentPanicked), end: endFailed, reason: "agent_panicked"},
	// Any stage but the end's, which "end failed" leaves undecided: its next delivery tries
	// the end again, with nothing to run.
	{name: "worker panicked", when: errIs(errWorkerPanicked), end: endFailed, reason: "worker_panicked"},
	{name: "permanent, unread", in: []stage{stageAdmit}, when: isPermanent, end: endRejected},
	{name: "permanent", when: isPermanent, end: endFailed},
	// A profile's secret is read for each job: one that cannot be read now, or whose value as
	// read cannot be used (a file read while it was being rewritten), may be fine a minute
	// later; the worker checked both at start. Any other egress setting the proxy refuses is
	// the profile's, for every job of it.
	{name: "secret unavailable", in: []stage{stagePrepare}, when: errIs(config.ErrSecretUnavailable), end: endTransient, retryAfter: time.Minute},
	{name: "secret value unusable", in: []stage{stagePrepare}, when: errIs(egress.ErrSecretValue), end: endTransient, retryAfter: time.Minute},
	{name: "egress the proxy refuses", in: []stage{stagePrepare}, when: errIs(egress.ErrInvalidPolicy, egress.ErrInvalidConfig), end: endFailed, reason: "invalid_profile"},

	// Transient faults: another delivery may succeed.
	{name: "sandbox backend unavailable", in: []stage{stagePrepare}, when: errIs(sandbox.ErrUnavailable), end: endTransient, retryAfter: time.Minute},
	// The model endpoint still unavailable when the run ended (its job_timeout passed while it
	// waited for the endpoint): delivered again no sooner than the endpoint asked, its
	// Retry-After as the model gate bounds it, nor than the backoff. A peer whose breaker is
	// closed would otherwise take it at once and wait out another job_timeout.
	{name: "model endpoint unavailable", in: []stage{stageRun}, when: errIs(agent.ErrModelUnavailable), build: modelUnavailableOutcome},
	// The sandbox went away under the job (its pod evicted, preempted or deleted; its workdir
	// removed): the platform's fault, never the job's success. Another delivery starts afresh.
	{name: "sandbox lost", when: errIs(sandbox.ErrSandboxLost), end: endTransient},
	{name: "finished", when: noErr, end: endSucceeded},
	{name: "transient", when: anyErr, end: endTransient},
}

// classify turns how a stage of an attempt ended, its error and the cause of the attempt's
// context (nil while the context lives), into the attempt's outcome. It is the only place
// where an error becomes an ending; decide then says what the ending means.
func classify(s stage, err, cause error) outcome {
	return match(s, err, cause).outcome(err, cause)
}

// classifyIn is classify with the cause of ctx, the attempt's context, as it is now: read
// when the stage's error is seen, never before the stage ran, so that a cancel or shutdown
// that cut the stage short is what its error means (a "context canceled" is no fault).
func classifyIn(ctx context.Context, s stage, err error) outcome {
	return classify(s, err, context.Cause(ctx))
}

// match is the first row of failureModes that applies.
func match(s stage, err, cause error) failureMode {
	for _, m := range failureModes {
		if m.applies(s) && m.when(err, cause) {
			return m
		}
	}
	// Unreachable: the last two rows match any error and none.
	return failureMode{name: "unmatched", end: endTransient}
}

func (m failureMode) applies(s stage) bool {
	if len(m.in) == 0 {
		return true
	}
	for _, in := range m.in {
		if in == s {
			return true
		}
	}
	return false
}

func (m failureMode) outcome(err, cause error) outcome {
	if m.build != nil {
		return m.build(err, cause)
	}
	switch {
	case err == nil:
	case m.reason != "":
		err = queue.Permanent(m.reason, err)
	case m.retryAfter > 0:
		err = queue.RetryAfter(m.retryAfter, err)
	}
	return outcome{end: m.end, err: err}
}

// errIs matches an error that is any of targets.
func errIs(targets ...error) func(err, cause error) bool {
	return func(err, _ error) bool {
		for _, t := range targets {
			if errors.Is(err, t) {
				return true
			}
		}
		return false
	}
}

func errOrCauseIs(target error) func(err, cause error) bool {
	return func(err, cause error) bool { return errors.Is(err, target) || errors.Is(cause, target) }
}

// leaseLostOutcome says why the lease was lost: the error when it says so, else the cause
// (the stage's error is then only the context's ending).
func leaseLostOutcome(err, cause error) outcome {
	if !errors.Is(err, errLeaseLost) {
		err = cause
	}
	return outcome{end: endLeaseLost, err: err}
}

func causeIs(target error) func(err, cause error) bool {
	return func(_, cause error) bool { return errors.Is(cause, target) }
}

// refusedNotMaybe: the store refused the tenant's writes, and no put it may have stored is
// still on its way.
func refusedNotMaybe(err, _ error) bool {
	return errors.Is(err, store.ErrWriteRefused) && !errors.Is(err, store.ErrMaybeStored)
}

func anyCause(_, cause error) bool { return cause != nil }
func anyErr(err, _ error) bool     { return err != nil }
func noErr(err, _ error) bool      { return err == nil }

func isCap(err, _ error) bool {
	var c *capError
	return errors.As(err, &c)
}

func isPermanent(err, _ error) bool {
	var perm *queue.PermanentError
	return errors.As(err, &perm)
}

// committed matches a committedError whose end has a dead letter (deadLetter) or not.
func committed(deadLetter bool) func(err, cause error) bool {
	return func(err, _ error) bool {
		var c *committedError
		return errors.As(err, &c) && c.failed() == deadLetter
	}
}

func committedOutcome(err, _ error) outcome {
	var c *committedError
	errors.As(err, &c)
	if c.failed() {
		return outcome{end: endDeadLetter, err: queue.Permanent(c.out.Reason, toldError{c.out.Error}), state: c.out.State}
	}
	return outcome{end: endDone, state: c.out.State}
}

// endedElsewhere matches a job the claim found ended (errJobEnded) in a state with a dead
// letter (deadLetter) or not.
func endedElsewhere(deadLetter bool) func(err, cause error) bool {
	return func(err, _ error) bool {
		var e *endedError
		return errors.Is(err, errJobEnded) && (errors.As(err, &e) && e.lettered()) == deadLetter
	}
}

// endedOutcome makes sure the dead letter of a job found ended exists (the server refuses a
// second, so one written already stays the only one), the letter its status says (the sweep's
// tenant_retired, setup's unknown_tenant, a worker's end), as every writer gives it.
func endedOutcome(err, _ error) outcome {
	var e *endedError
	errors.As(err, &e)
	reason, why, _ := queue.EndedLetter(e.tenant, e.st)
	return outcome{end: endDeadLetter, err: queue.Permanent(reason, toldError{why.Error()})}
}

// modelUnavailableOutcome is a transient end that asks for the endpoint's Retry-After
// (agent.RetryAfterError) before the next delivery, when it named one.
func modelUnavailableOutcome(err, _ error) outcome {
	var ra *agent.RetryAfterError
	if errors.As(err, &ra) && ra.Delay > 0 {
		err = queue.RetryAfter(ra.Delay, err)
	}
	return outcome{end: endTransient, err: err}
}

func causeOutcome(end ending) func(err, cause error) outcome {
	return func(_, cause error) outcome { return outcome{end: end, err: cause} }
}
