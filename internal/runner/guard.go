package runner

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"runtime/debug"
)

// errWorkerPanicked: a stage of the attempt other than the agent's run panicked (admit, claim,
// prepare, collect, commit), or a goroutine the attempt started (goGuarded): a bug in the
// worker that the same job would likely meet again on every worker it is delivered to, taking
// down one after another, so it fails, not retried, and the worker goes on with its other jobs.
var errWorkerPanicked = errors.New("the worker panicked on the job (a bug in the worker; its log has the stack)")

// errEndPanicked: the commit of the job's end panicked (survive in the end stage). The job
// has no manifest: its next delivery tries the end again, and its last fails it without one
// (endPanickedInEnd), as a panic that recurs would otherwise cycle through every worker.
var errEndPanicked = fmt.Errorf("%w, recording its end", errWorkerPanicked)

// panicMessage is the log line of a panic that fails its job (survive, goGuarded).
const panicMessage = "the worker panicked on the job; the job fails and the worker goes on"

// survive, deferred by a stage's caller, ends the attempt as a stage's error when the stage
// panicked: the panic's value and stack go to the worker's log with the job's id and tenant,
// and e, the attempt's end, becomes what classify makes of errWorkerPanicked in the stage in
// progress (a.at). The defers of the stages themselves (the sandbox's close, the egress's)
// ran before it, as the panic unwound them.
func (a *attempt) survive(ctx context.Context, e *ended) {
	p := recover()
	if p == nil {
		return
	}
	a.log.ErrorContext(ctx, panicMessage, "stage", a.at.String(), "panic", fmt.Sprint(p), "stack", string(debug.Stack()))
	which := errWorkerPanicked
	if a.at == stageEnd {
		which = errEndPanicked
	}
	err := fmt.Errorf("%w: in its %s stage: %v", which, a.at, p)
	*e = ended{outcome: classifyIn(ctx, a.at, err), began: e.began}
}

// goGuarded runs f on a goroutine of its own beside the attempt's stages (its heartbeats, a
// progress write, its egress proxy and the proxy's connections). A panic in f ends the
// attempt as the worker's panic, as one in a stage does (survive): the attempt's context ends
// with errWorkerPanicked as its cause, which the stage in progress is classified by, and the
// panic's value and stack go to the log with the job's id and tenant. A recover in the stage's
// goroutine never sees a panic of another goroutine, which ended the process. f's own defers
// run before, as the panic unwinds them: a caller waiting for f to end is told so.
func (a *attempt) goGuarded(ctx context.Context, what string, f func()) {
	go func() {
		defer recoverAs(ctx, a.log, what, a.cancel)
		f()
	}()
}

// recoverAs, deferred by a goroutine that works for a job (goGuarded, the cancel watch's
// handling of a request), ends a panic of it: stop is given errWorkerPanicked with the
// panic's value (it ends the job's attempt), and log, which names the job, gets the stack.
func recoverAs(ctx context.Context, log *slog.Logger, what string, stop func(error)) {
	p := recover()
	if p == nil {
		return
	}
	// The cause first: who reads the line finds the attempt already stopped.
	stop(fmt.Errorf("%w: in its %s: %v", errWorkerPanicked, what, p))
	log.ErrorContext(ctx, panicMessage, "stage", what, "panic", fmt.Sprint(p), "stack", string(debug.Stack()))
}

// surviveSettle, deferred by the settling of an attempt, logs a panic in it and leaves the
// delivery as it is: its heartbeats stop (release), and the job's next delivery, after the ack
// wait, ends it as its status and manifest say, or runs it again.
func (a *attempt) surviveSettle(ctx context.Context) {
	if p := recover(); p != nil {
		a.log.ErrorContext(ctx, "the worker panicked settling the job; it is left to its next delivery",
			"panic", fmt.Sprint(p), "stack", string(debug.Stack()))
	}
}
