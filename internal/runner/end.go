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

// A job ends exactly once: with one committed manifest, and for a failed or dead job one dead
// letter. The manifest key, written create-only, is the one arbiter: a run commits by winning
// it, and a job that dies without a run to commit (its last delivery failed before the agent
// ran, or it is exhausted) must win it too, with a manifest that records it dead, before it is
// dead-lettered. Whoever loses ends the job as the winner's manifest says.

// exhausted ends a job whose last delivery ended without settling: its worker died, or stalled
// past AckWait and may still commit. This delivery never runs the job.
func (r *Runner) exhausted(ctx context.Context, a *attempt) outcome {
	cause := fmt.Sprintf("no worker finished the job in %d deliveries", r.cfg.Worker.NATS.MaxDeliver)
	if st, err := r.cfg.Queue.Status(ctx, a.job.ID); err == nil && st.Error != "" {
		cause += "; the last error: " + st.Error
	}
	a.log.WarnContext(ctx, "job exhausted its deliveries; ending it", "max_deliver", r.cfg.Worker.NATS.MaxDeliver)
	return r.commitDead(ctx, a, outcome{end: endTransient, err: errors.New(cause)})
}

// commitDead wins the arbiter for a job that dies without a run (o's decision on this delivery
// is dead), or finds the run that won it first. Its manifest names one transcript line that
// says why the job died.
func (r *Runner) commitDead(ctx context.Context, a *attempt, o outcome) outcome {
	if len(a.result.Transcript) == 0 {
		line, err := json.Marshal(map[string]any{"type": "dead", "reason": decide(o, true).reason, "error": o.err.Error(), "at": time.Now().UTC()})
		if err != nil {
			return outcome{end: endUndecided, err: err}
		}
		a.result.Transcript = append(line, '\n')
	}
	err := r.commit(ctx, a, nil, o)
	if err != nil && !errors.Is(err, errLeaseLost) {
		// Not decided: dead-lettering now could race a stale attempt that commits later.
		return outcome{end: endUndecided, err: fmt.Errorf("record the job as dead: %w", err)}
	}
	end := r.endCommitted(ctx, a)
	// Only the delivery that won the arbiter counts the death.
	end.committed = err == nil && end.end == endDeadLetter
	return end
}

// endCommitted ends the job as its committed manifest says: the status follows the manifest,
// and a failed or dead run gets its dead letter (once: its committer may have died before).
func (r *Runner) endCommitted(ctx context.Context, a *attempt) outcome {
	out, err := r.adoptCommitted(ctx, a.job.ID)
	if err != nil {
		return outcome{end: endUndecided, err: err}
	}
	if out.State == job.StateFailed || out.State == job.StateDead {
		return outcome{end: endDeadLetter, err: queue.Permanent(out.Reason, errors.New(out.Error))}
	}
	return outcome{end: endDone}
}
