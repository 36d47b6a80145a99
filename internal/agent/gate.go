package agent

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"

	"github.com/boxcar-run/boxcar/internal/modelgate"
)

// send sends one turn's request and returns the endpoint's answer. A request that found the
// endpoint unavailable (no response, 408, 409, 429 or 5xx after the client's retries) is not
// a turn: the endpoint did no work for it. When the Gate holds it (the failures persist and
// are not this job's alone: the gate probes to tell) the turn then waits until the endpoint
// is up again and is sent anew, so an outage spends nothing of the job's budget; the wait
// ends with the job's timeout (ErrModelUnavailable: the job was not at fault, its caller may
// try it again, after the endpoint's Retry-After when the gate knows one: RetryAfterError) or
// with ctx. A failure the gate let pass (one that does not persist, one no attempt reached
// the gate with, or one the probe found the job's own, which the error then says: ownFailures)
// ends the run as without a gate. start is when the answered request was sent.
func (r *run) send(ctx context.Context, turn int, params openai.ChatCompletionNewParams) (resp *openai.ChatCompletion, wire wireBytes, start time.Time, err error) {
	gate := r.agent.cfg.Gate
	// The gate tells this job's failures from an outage.
	ctx = modelgate.WithJob(ctx, r.req.JobID)
	for held := false; ; held = true {
		if gate != nil {
			if err := r.awaitModel(ctx, gate, turn, held); err != nil {
				return nil, wire, start, err
			}
		}
		if m := r.req.Meter; m != nil {
			if err := m.Allow(ctx); err != nil {
				return nil, wire, start, err
			}
		}
		// The turn counts from here on: a process that dies while the request is out may
		// have had it answered (and billed), and the progress event records that.
		r.used.Turns = turn
		r.progress(Event{Kind: EventModelRequest, Turn: turn, ToolCalls: len(r.res.ToolCalls), MaxToolCalls: r.p.Limits.MaxToolCalls, Spent: r.spent()})
		start = time.Now()
		var rp reply
		resp, err = r.agent.chat.New(ctx, params, option.WithMiddleware(r.logAttempt, rp.record))
		switch {
		case err == nil:
			return resp, rp.wire, start, nil
		case ctx.Err() != nil:
			return nil, wire, start, context.Cause(ctx)
		}
		err = modelError(err, &rp, r.agent.cfg.APIKey)
		if !errors.Is(err, ErrModelUnavailable) {
			return nil, wire, start, err
		}
		// Not a turn after all: the event takes it back, so that the caller's record of
		// the spending matches Result.Spent, also for a turn that waits out an outage.
		r.used.Turns = turn - 1
		r.progress(Event{Kind: EventModelUnavailable, Turn: turn, ToolCalls: len(r.res.ToolCalls), MaxToolCalls: r.p.Limits.MaxToolCalls, Spent: r.spent()})
		switch verdict(ctx, gate) {
		case modelgate.Own:
			return nil, wire, start, unavailable(gate, fmt.Errorf("%w; %s", err, ownFailures))
		case modelgate.Pass:
			return nil, wire, start, unavailable(gate, err)
		}
		r.log.Warn("model endpoint unavailable; the turn waits for it and is not counted", "turn", turn, "error", err)
	}
}

// ownFailures is what a run's error adds when the gate's probe found its failures its own: the
// job's status says so (retrying, or dead at its last delivery), for its submitter to look at
// what the job sends rather than wait for an outage to end.
const ownFailures = "the endpoint answered other requests meanwhile: its failures were this job's own " +
	"(what it sends may be what the server fails on)"

// verdict is the gate's Held, Pass without a gate.
func verdict(ctx context.Context, gate Gate) modelgate.Verdict {
	if gate == nil {
		return modelgate.Pass
	}
	return gate.Held(ctx)
}

// awaitModel waits on the gate before a turn's request; held says the turn was refused before.
func (r *run) awaitModel(ctx context.Context, gate Gate, turn int, held bool) error {
	start := time.Now()
	err := gate.Wait(ctx)
	switch {
	case err == nil:
		if held {
			r.log.Info("model endpoint up again; sending the turn again", "turn", turn, "waited_ms", sinceMS(start))
		}
		return nil
	case errors.Is(context.Cause(ctx), errJobTimeout):
		// The job's timeout passed while the endpoint was down: that is no cap the job hit.
		return unavailable(gate, fmt.Errorf("agent: job %s turn %d: %w: still down at the job timeout (waited %s)",
			r.req.JobID, turn, ErrModelUnavailable, time.Since(start).Round(time.Second)))
	}
	return err
}
