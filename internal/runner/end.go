package runner

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/boxcar-run/boxcar/internal/job"
	"github.com/boxcar-run/boxcar/internal/queue"
)

// A job ends exactly once: with one committed manifest, and for a failed, rejected or dead
// job one dead letter. The manifest key, written create-only, is the one arbiter: a run commits
// by winning it, and a job that ends without a run to commit (a delivery rejected it or failed
// it before its agent ran, it was cancelled before it started, its last delivery failed before
// the agent ran, or it is exhausted) must win it too, with a manifest that records that end,
// before it is dead-lettered or acknowledged. Whoever loses ends the job as the winner's
// manifest says. Only a message that names no valid job id (no Nats-Msg-Id header, or one that
// is not an id) ends without a manifest: no delivery of it can run or commit, since a run needs
// its header to be its JSON id and a valid one (see process), so each delivery ends it the
// same way, and the dead letter is written once (queue.Delivery.Term).

// exhausted ends a job whose last delivery ended without settling: its worker died, or stalled
// past AckWait and may still commit. This delivery never runs the job.
func (r *Runner) exhausted(ctx context.Context, a *attempt) outcome {
	cause := fmt.Sprintf("no worker finished the job in %d deliveries", r.cfg.Worker.NATS.MaxDeliver)
	st, err := awaitAnswerTo(ctx, r, a, "NATS", "before the job can end", statusAnswered, func(ctx context.Context) (job.Status, error) {
		return r.cfg.Queue.Status(ctx, a.job.ID)
	})
	if err == nil && st.Error != "" {
		cause += "; the last error: " + st.Error
	}
	a.log.WarnContext(ctx, "job exhausted its deliveries; ending it", "max_deliver", r.cfg.Worker.NATS.MaxDeliver)
	return r.commitEnd(ctx, a, outcome{end: endTransient, err: errors.New(cause)})
}

// commitEnd wins the arbiter for a job that ends here without a run (o's decision on this
// delivery is terminal and nothing was committed), or finds the run that won it first. Its
// manifest names one transcript line that says how and why the job ended. It runs on a context
// that survives a cancelled job's, which is what a cancelled end commits.
func (r *Runner) commitEnd(ctx context.Context, a *attempt, o outcome) outcome {
	if ctx.Err() != nil {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(context.WithoutCancel(ctx), r.cfg.CleanupTimeout)
		defer cancel()
	}
	dec := decide(o, a.d.LastAttempt())
	if a.transcript.size == 0 {
		cause := ""
		if o.err != nil {
			cause = o.err.Error()
		}
		line, err := json.Marshal(map[string]any{"type": string(dec.state), "reason": dec.reason, "error": cause, "at": time.Now().UTC()})
		if err != nil {
			return outcome{end: endUndecided, err: err}
		}
		a.transcript = memOutput(transcriptName, append(line, '\n'))
	}
	err := r.commitWhenSafe(ctx, a, nil, o)
	if err != nil && !errors.Is(err, errLeaseLost) {
		// Not decided: ending the job now could race a stale attempt that commits later.
		return outcome{end: endUndecided, err: fmt.Errorf("record the job as %s: %w", dec.state, err)}
	}
	end := r.endCommitted(ctx, a)
	// Only the delivery that won the arbiter counts the end.
	end.committed = err == nil && (end.end == endDeadLetter || end.end == endDone)
	return end
}

// endCommitted ends the job as its committed manifest says: the status follows the manifest,
// and a failed, rejected or dead run gets its dead letter (once: its committer may have died
// before).
func (r *Runner) endCommitted(ctx context.Context, a *attempt) outcome {
	out, err := r.adoptCommitted(ctx, a)
	if err != nil {
		return outcome{end: endUndecided, err: err}
	}
	if out.State == job.StateFailed || out.State == job.StateDead || out.State == job.StateRejected {
		return outcome{end: endDeadLetter, err: queue.Permanent(out.Reason, errors.New(out.Error)), state: out.State}
	}
	return outcome{end: endDone, state: out.State}
}
