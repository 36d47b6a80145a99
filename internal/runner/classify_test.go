package runner

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"testing"
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

// want is an ending with the dead letter's reason ("" for none) and the delay a transient
// ending asks for (0 for the backoff).
type want struct {
	end    ending
	reason string
	delay  time.Duration
	cap    string // of a capped ending; empty: max_turns, the cap the "capped" case names
}

var allStages = []stage{stageAdmit, stageClaim, stagePrepare, stageRun, stageCollect, stageCommit, stageEnd}

// TestClassify is the whole table of how a stage's error becomes an ending: every error class
// in every stage. A case names the stages where the class means something of its own (at);
// in every other stage it gets other.
func TestClassify(t *testing.T) {
	t.Parallel()
	wrap := func(err error) error { return fmt.Errorf("stage said: %w", err) }
	transient := want{end: endTransient}
	tests := []struct {
		name       string
		err, cause error
		at         map[stage]want
		other      want
	}{
		{name: "no error", other: want{end: endSucceeded}},
		{name: "network error", err: errors.New("dial tcp 127.0.0.1:4222: connection refused"),
			at: map[stage]want{stageEnd: {end: endUndecided}}, other: transient},
		{name: "lease lost", err: wrap(errLeaseLost), other: want{end: endLeaseLost}},
		{name: "lease lost while cancelled", err: wrap(errLeaseLost), cause: errCancelled, other: want{end: endLeaseLost}},
		// A status write found a later delivery (writeStatus) and stopped the attempt: the
		// stage's error is only the context's ending.
		{name: "stopped for a lost lease", err: errors.New("context canceled"), cause: wrap(errLeaseLost), other: want{end: endLeaseLost}},
		{name: "stopped for a lost lease, no error", cause: wrap(errLeaseLost), other: want{end: endLeaseLost}},
		{name: "job ended elsewhere", err: errJobEnded,
			at: map[stage]want{stageClaim: {end: endDone}, stageEnd: {end: endUndecided}}, other: transient},
		{name: "job ended succeeded elsewhere", err: &endedError{st: job.Status{State: job.StateSucceeded}},
			at: map[stage]want{stageClaim: {end: endDone}, stageEnd: {end: endUndecided}}, other: transient},
		// Setup retiring the tenant wrote the job dead and stopped before its letter.
		{name: "job ended dead elsewhere", err: &endedError{st: job.Status{State: job.StateDead, Error: queue.ReasonUnknownTenant + ": why"}},
			at: map[stage]want{stageClaim: {end: endDeadLetter, reason: queue.ReasonUnknownTenant}, stageEnd: {end: endUndecided}}, other: transient},
		// A worker's sweep of the retired tenant wrote the job dead and stopped before its letter;
		// a worker of the old config, which still serves the tenant, delivers it again.
		{name: "job ended dead by a retired tenant's sweep", err: &endedError{tenant: "team-b", st: job.Status{State: job.StateDead, Error: queue.SweptCause("team-b").Error()}},
			at: map[stage]want{stageClaim: {end: endDeadLetter, reason: queue.ReasonTenantRetired}, stageEnd: {end: endUndecided}}, other: transient},
		{name: "job ended dead after its deliveries", err: &endedError{tenant: "team-b", st: job.Status{State: job.StateDead, Error: "the job's own error"}},
			at: map[stage]want{stageClaim: {end: endDeadLetter, reason: "max_deliveries"}, stageEnd: {end: endUndecided}}, other: transient},
		{name: "job ended failed elsewhere", err: &endedError{st: job.Status{State: job.StateFailed, Error: "input missing"}},
			at: map[stage]want{stageClaim: {end: endDeadLetter, reason: "failed"}, stageEnd: {end: endUndecided}}, other: transient},
		{name: "job ended dead elsewhere during shutdown", err: &endedError{st: job.Status{State: job.StateDead}}, cause: errShutdown,
			other: want{end: endInterrupted}},
		{name: "committed as succeeded", err: &committedError{out: provenance.Outcome{State: job.StateSucceeded}},
			at: map[stage]want{stageClaim: {end: endDone}, stageEnd: {end: endDone}}, other: transient},
		{name: "committed as succeeded during shutdown", err: &committedError{out: provenance.Outcome{State: job.StateSucceeded}}, cause: errShutdown,
			at: map[stage]want{stageClaim: {end: endDone}, stageEnd: {end: endDone}}, other: want{end: endInterrupted}},
		{name: "committed as failed", err: &committedError{out: provenance.Outcome{State: job.StateFailed, Reason: "input_missing"}},
			at: map[stage]want{stageClaim: {end: endDeadLetter, reason: "input_missing"}, stageEnd: {end: endDeadLetter, reason: "input_missing"}}, other: transient},
		{name: "committed as dead during shutdown", err: &committedError{out: provenance.Outcome{State: job.StateDead, Reason: "max_deliveries"}}, cause: errShutdown,
			other: want{end: endInterrupted}},
		{name: "cancelled before it started", err: errCancelled,
			at: map[stage]want{stageClaim: {end: endCancelled}, stageEnd: {end: endUndecided}}, other: transient},
		{name: "cancelled while it ran", err: errors.New("context canceled"), cause: errCancelled, other: want{end: endCancelled}},
		{name: "cancelled, no error", cause: errCancelled, other: want{end: endCancelled}},
		{name: "shutdown", err: errors.New("context canceled"), cause: errShutdown, other: want{end: endInterrupted}},
		// The drain grace ran out mid-upload: the store's error is the shutdown's doing.
		{name: "upload cut short by a shutdown", err: fmt.Errorf("upload results: upload report.md: store: put-if-absent k: %w", context.Canceled), cause: errShutdown, other: want{end: endInterrupted}},
		{name: "shutdown, no error", cause: errShutdown, other: want{end: endInterrupted}},
		{name: "capped", err: &capError{cap: agent.CapMaxTurns},
			at: map[stage]want{stageRun: {end: endCapped}, stageEnd: {end: endUndecided}}, other: transient},
		{name: "tenant budget exhausted", err: wrap(errBudgetExhausted),
			at: map[stage]want{stageRun: {end: endCapped, cap: capBudgetExhausted}, stageEnd: {end: endUndecided}}, other: transient},
		{name: "exhausted", err: wrap(errExhausted),
			at: map[stage]want{stageEnd: {end: endUndecided}}, other: transient},
		{name: "invalid job", err: wrap(job.ErrInvalid),
			at: map[stage]want{stageAdmit: {end: endRejected, reason: "invalid_job"}, stageEnd: {end: endUndecided}}, other: transient},
		{name: "unknown profile", err: wrap(config.ErrUnknownProfile),
			at: map[stage]want{stageAdmit: {end: endRejected, reason: "unknown_profile"}, stageEnd: {end: endUndecided}}, other: transient},
		{name: "network wider than the profile's", err: wrap(egress.ErrWiden),
			at: map[stage]want{stageAdmit: {end: endRejected, reason: "network_not_allowed"}, stageEnd: {end: endUndecided}}, other: transient},
		{name: "backend gives no egress", err: wrap(sandbox.ErrNoEgress),
			at: map[stage]want{stagePrepare: {end: endFailed, reason: "invalid_profile"}, stageEnd: {end: endUndecided}}, other: transient},
		{name: "profile not granted", err: wrap(config.ErrProfileNotGranted),
			at: map[stage]want{stageAdmit: {end: endRejected, reason: "profile_not_granted"}, stageEnd: {end: endUndecided}}, other: transient},
		{name: "input outside tenant", err: wrap(errInputOutsideTenant),
			at: map[stage]want{stagePrepare: {end: endFailed, reason: "input_outside_tenant"}, stageEnd: {end: endUndecided}}, other: transient},
		{name: "store refuses the tenant's writes", err: wrap(store.ErrWriteRefused),
			at: map[stage]want{stageClaim: {end: endFailed, reason: "store_write_refused"}, stageCommit: {end: endFailed, reason: "store_write_refused"}, stageEnd: {end: endUndecided}}, other: transient},
		// An earlier put of the manifest may yet land: the job is not failed without one.
		{name: "store refuses a put again of one that may land", err: wrap(fmt.Errorf("%w; %w", store.ErrWriteRefused, store.ErrMaybeStored)),
			at: map[stage]want{stageEnd: {end: endUndecided}}, other: transient},
		{name: "input too large", err: wrap(errInputTooLarge),
			at: map[stage]want{stageAdmit: {end: endFailed, reason: "input_too_large"}, stageEnd: {end: endUndecided}}, other: transient},
		{name: "workdir full", err: wrap(sandbox.ErrDiskFull),
			at: map[stage]want{stagePrepare: {end: endFailed, reason: "input_too_large"}, stageEnd: {end: endUndecided}}, other: transient},
		{name: "not in the store", err: wrap(store.ErrNotFound),
			at: map[stage]want{stagePrepare: {end: endFailed, reason: "input_missing"}, stageEnd: {end: endUndecided}}, other: transient},
		{name: "input refused", err: wrap(store.ErrReadRefused),
			at: map[stage]want{stagePrepare: {end: endFailed, reason: "input_refused"}, stageEnd: {end: endUndecided}}, other: transient},
		{name: "input changed", err: wrap(errInputMismatch),
			at: map[stage]want{stagePrepare: {end: endFailed, reason: "input_digest_mismatch"}, stageEnd: {end: endUndecided}}, other: transient},
		{name: "model refuses the key", err: wrap(agent.ErrModelAuth),
			at: map[stage]want{stageRun: {end: endFailed, reason: "model_rejected"}, stageEnd: {end: endUndecided}}, other: transient},
		{name: "model rejects the request", err: wrap(agent.ErrModelRequest),
			at: map[stage]want{stageRun: {end: endFailed, reason: "model_rejected"}, stageEnd: {end: endUndecided}}, other: transient},
		{name: "model unavailable", err: wrap(agent.ErrModelUnavailable),
			at: map[stage]want{stageEnd: {end: endUndecided}}, other: transient},
		// Still down at the job's timeout, the endpoint having asked for 4 minutes more.
		{name: "model unavailable with a Retry-After", err: wrap(&agent.RetryAfterError{Delay: 4 * time.Minute, Err: agent.ErrModelUnavailable}),
			at: map[stage]want{stageRun: {end: endTransient, delay: 4 * time.Minute}, stageEnd: {end: endUndecided}}, other: transient},
		{name: "agent refuses the profile", err: wrap(agent.ErrInvalidRequest),
			at: map[stage]want{stageRun: {end: endFailed, reason: "invalid_profile"}, stageEnd: {end: endUndecided}}, other: transient},
		{name: "agent panicked", err: wrap(errAgentPanicked),
			at: map[stage]want{stageRun: {end: endFailed, reason: "agent_panicked"}, stageEnd: {end: endUndecided}}, other: transient},
		{name: "worker panicked", err: wrap(errWorkerPanicked),
			at: map[stage]want{stageEnd: {end: endUndecided}}, other: want{end: endFailed, reason: "worker_panicked"}},
		// survive in the end stage: the commit of the end panicked, whatever else stopped it.
		{name: "worker panicked in the end", err: wrap(errEndPanicked),
			at: map[stage]want{stageEnd: {end: endPanickedInEnd, reason: "worker_panicked"}}, other: want{end: endFailed, reason: "worker_panicked"}},
		{name: "worker panicked in the end of a cancelled job", err: wrap(errEndPanicked), cause: errCancelled,
			at: map[stage]want{stageEnd: {end: endPanickedInEnd, reason: "worker_panicked"}}, other: want{end: endCancelled}},
		// A goroutine of the attempt panicked (goGuarded): whatever the stage was doing, its
		// error only the context's ending, or none.
		{name: "a goroutine of the attempt panicked", err: errors.New("context canceled"), cause: wrap(errWorkerPanicked),
			other: want{end: endFailed, reason: "worker_panicked"}},
		{name: "a goroutine of the attempt panicked, no error", cause: wrap(errWorkerPanicked),
			other: want{end: endFailed, reason: "worker_panicked"}},
		{name: "permanent with its reason", err: wrap(queue.Permanent("report_too_large", errors.New("too large"))),
			at: map[stage]want{stageAdmit: {end: endRejected, reason: "report_too_large"}, stageEnd: {end: endUndecided}}, other: want{end: endFailed, reason: "report_too_large"}},
		{name: "secret unavailable", err: wrap(config.ErrSecretUnavailable),
			at: map[stage]want{stagePrepare: {end: endTransient, delay: time.Minute}, stageEnd: {end: endUndecided}}, other: transient},
		// A file read while it was being rewritten: the worker checked the value at start.
		{name: "secret value unusable", err: fmt.Errorf("stage said: %w: %w", egress.ErrInvalidPolicy, egress.ErrSecretValue),
			at: map[stage]want{stagePrepare: {end: endTransient, delay: time.Minute}, stageEnd: {end: endUndecided}}, other: transient},
		{name: "egress the proxy refuses", err: wrap(egress.ErrInvalidPolicy),
			at: map[stage]want{stagePrepare: {end: endFailed, reason: "invalid_profile"}, stageEnd: {end: endUndecided}}, other: transient},
		{name: "egress config the proxy refuses", err: wrap(egress.ErrInvalidConfig),
			at: map[stage]want{stagePrepare: {end: endFailed, reason: "invalid_profile"}, stageEnd: {end: endUndecided}}, other: transient},
		{name: "sandbox backend unavailable", err: wrap(sandbox.ErrUnavailable),
			at: map[stage]want{stagePrepare: {end: endTransient, delay: time.Minute}, stageEnd: {end: endUndecided}}, other: transient},
		{name: "sandbox lost", err: wrap(sandbox.ErrSandboxLost),
			at: map[stage]want{stageEnd: {end: endUndecided}}, other: transient},
		{name: "sandbox lost over its disk bound", err: wrap(fmt.Errorf("evicted: %w: %w", sandbox.ErrDiskFull, sandbox.ErrSandboxLost)),
			at: map[stage]want{stagePrepare: {end: endFailed, reason: "input_too_large"}, stageRun: {end: endCapped, cap: capDisk},
				stageCollect: {end: endCapped, cap: capDisk}, stageEnd: {end: endUndecided}}, other: transient},
		{name: "retry after", err: queue.RetryAfter(time.Second, errors.New("slow down")),
			at: map[stage]want{stageEnd: {end: endUndecided, delay: time.Second}}, other: want{end: endTransient, delay: time.Second}},
		{name: "end undecided", err: wrap(errUndecided), other: want{end: endUndecided}},
		{name: "end undecided during shutdown", err: wrap(errUndecided), cause: errShutdown, other: want{end: endInterrupted}},
	}
	rows := map[string]bool{}
	for _, tt := range tests {
		for _, s := range allStages {
			w, ok := tt.at[s]
			if !ok {
				w = tt.other
			}
			t.Run(tt.name+"/"+s.String(), func(t *testing.T) {
				rows[match(s, tt.err, tt.cause).name] = true
				o := classify(s, tt.err, tt.cause)
				if o.end != w.end {
					t.Fatalf("classify(%s, %v, cause %v) = %s, want %s", s, tt.err, tt.cause, o.end, w.end)
				}
				var perm *queue.PermanentError
				switch {
				case w.reason != "" && (!errors.As(o.err, &perm) || perm.Reason != w.reason):
					t.Errorf("reason = %+v, want %q", o.err, w.reason)
				case w.reason == "" && o.end != endDeadLetter && o.end != endUndecided && errors.As(o.err, &perm):
					t.Errorf("a %s ending carries the permanent reason %q", o.end, perm.Reason)
				}
				var retry *queue.RetryAfterError
				if got := time.Duration(0); errors.As(o.err, &retry) {
					got = retry.Delay
					if got != w.delay {
						t.Errorf("retry after %s, want %s", got, w.delay)
					}
				} else if w.delay != 0 {
					t.Errorf("no delay, want %s", w.delay)
				}
				if wantCap := cmp.Or(w.cap, agent.CapMaxTurns); o.end == endCapped && o.cap != wantCap {
					t.Errorf("capped at %q, want %q", o.cap, wantCap)
				}
				if tt.err != nil && o.err == nil && o.end != endDone && o.end != endCapped {
					t.Errorf("the ending %s lost the error %v", o.end, tt.err)
				}
			})
		}
	}
	for _, m := range failureModes {
		if !rows[m.name] {
			t.Errorf("row %q of failureModes is not exercised by any case", m.name)
		}
	}
}

// TestClassifyEveryStage: classify knows every stage, and every ending it gives is one
// decide knows.
func TestClassifyEveryStage(t *testing.T) {
	t.Parallel()
	if len(allStages) != len(stageNames) {
		t.Fatalf("the test covers %d stages, the runner has %d", len(allStages), len(stageNames))
	}
	for _, m := range failureModes {
		if m.build == nil && endingNames[m.end] == "" {
			t.Errorf("row %q gives an ending decide does not know", m.name)
		}
	}
}
