package runner

import (
	"context"
	"errors"
	"fmt"
	"runtime/debug"
)

// errWorkerPanicked: a stage of the attempt other than the agent's run panicked (admit, claim,
// prepare, collect, commit): a bug in the worker that the same job would likely meet again on
// every worker it is delivered to, taking down one after another, so it fails, not retried,
// and the worker goes on with its other jobs.
var errWorkerPanicked = errors.New("the worker panicked on the job (a bug in the worker; its log has the stack)")

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
	a.log.ErrorContext(ctx, "the worker panicked on the job; the job fails and the worker goes on",
		"stage", a.at.String(), "panic", fmt.Sprint(p), "stack", string(debug.Stack()))
	err := fmt.Errorf("%w: in its %s stage: %v", errWorkerPanicked, a.at, p)
	*e = ended{outcome: classifyIn(ctx, a.at, err), began: e.began}
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
