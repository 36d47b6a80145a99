package runner

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/boxcar-run/boxcar/internal/job"
	"github.com/boxcar-run/boxcar/internal/queue"
	"github.com/boxcar-run/boxcar/internal/store"
)

// A job ends exactly once: with one committed manifest, and for a failed, rejected or dead
// job one dead letter. The manifest key, written create-only, is the one arbiter: a run commits
// by winning it, and a job that ends without a run to commit (a delivery rejected it or failed
// it before its agent ran, it was cancelled before it started, its last delivery failed before
// the agent ran, or it is exhausted) must win it too, with a manifest that records that end,
// before it is dead-lettered or acknowledged. Whoever loses ends the job as the winner's
// manifest says. Only a message whose subject names no valid job id ends without a manifest:
// no delivery of it can run or commit, since a run needs its subject's id to be its JSON id
// and a valid one (see process), so each delivery ends it the
// same way, and the dead letter is written once (queue.Delivery.Term). So does a job whose
// claim, or whose commit, found the store refusing the worker's writes under its tenant's
// folder (store.ErrWriteRefused), as store_write_refused, and one whose end's own manifest the
// store refuses (commitEnd), as that end was decided: no manifest can be written there, and no
// delivery of a worker with the same credentials can commit one while the refusal stands. The
// final status names the attempt that ended the job (ended.unkept), so a stale attempt of the
// job (a worker that stalled past AckWait) whose commit comes after the refusal was lifted, or
// whose worker has other credentials, finds a later attempt (checkAttempt) and discards its
// run; only one that reads the status before that end is written can still commit beside it.

// exhausted is the claim of a job whose last delivery ended without settling: its worker
// died, or stalled past AckWait and may still commit. This delivery never runs the job; the
// error it returns ends it as dead (Handle commits that end), or as cancelled when a cancel
// was asked before: the user stopped the job before its end was decided, a job nobody needs
// to look into, and a status the cancel already made final must not get a second end.
func (r *Runner) exhausted(ctx context.Context, a *attempt) error {
	cause := fmt.Errorf("%w in %d deliveries", errExhausted, r.cfg.Worker.NATS.MaxDeliver)
	st, err := awaitAnswerTo(ctx, r, a, "NATS", "before the job can end", statusAnswered, func(ctx context.Context) (job.Status, error) {
		return r.cfg.Queue.Status(ctx, a.ref(a.job.ID))
	})
	if err == nil && cancelRequested(st) {
		a.cancel(errCancelled)
		return errCancelled
	}
	if err == nil && st.Error != "" {
		cause = fmt.Errorf("%w; the last error: %s", cause, st.Error)
	}
	a.log.WarnContext(ctx, "job exhausted its deliveries; ending it", "max_deliver", r.cfg.Worker.NATS.MaxDeliver)
	return cause
}

// claimEnd is the claim of an end decided by a delivery that did not claim the job (admit
// refused it, or it is exhausted): as a claim's running write does for a run, its write of the
// end it is about to commit (job.Status.Ending) is a compare-and-set on the status it reads,
// so that a cancel written after admit's look (cancelAsked) and before this write wins, and
// one written after it only marks cancel_requested. Otherwise the watch would record the job
// cancelled beside a rejected or dead manifest and its dead letter. It returns e as it is
// (the end to commit), cancelled, or lease lost or undecided, which commit nothing.
func (r *Runner) claimEnd(ctx context.Context, a *attempt, e ended) ended {
	if e.began || e.end == endCancelled {
		return e // the claim's own running write came first, or the cancel won already
	}
	ctx, cancel := r.commitContext(ctx, a)
	defer cancel()
	dec := decide(e.outcome, a.d.LastAttempt())
	st, err := awaitAnswerTo(ctx, r, a, "NATS", "before the job can end", natsAnswered, func(ctx context.Context) (job.Status, error) {
		return r.writeStatus(ctx, a, a.job.ID, func(s *job.Status) {
			s.Ending = dec.state
			if s.State == "" { // none yet (submit writes none): queued until the end is recorded
				s.State, s.Profile, s.QueuedAt = job.StateQueued, a.job.Profile, a.job.SubmittedAt
			}
		})
	})
	switch {
	case err == nil && !st.CancelRequested, errors.Is(err, queue.ErrFinal) && st.State != job.StateCancelled:
		// Ours to commit; or ended elsewhere: commitEnd adopts its manifest.
		return e
	case err == nil, errors.Is(err, queue.ErrFinal):
		// A cancel asked before this write: the job never ran, and it ends cancelled.
		e.outcome = classify(stageClaim, errCancelled, nil)
		return e
	case errors.Is(err, errLeaseLost):
		e.outcome = classify(stageEnd, err, nil)
	default:
		e.outcome = classify(stageEnd, fmt.Errorf("%w: record the job as %s: %w", errUndecided, dec.state, err), nil)
	}
	return e
}

// commitEnd wins the arbiter for a job that ends here without a run committed (e's decision
// on this delivery is terminal and nothing was committed), or finds the run that won it first.
// Its manifest names the run's transcript, or one line that says how and why the job ended. It
// runs on the commit's context (commitContext), which survives a cancelled job's: that is what
// a cancelled end commits.
func (r *Runner) commitEnd(ctx context.Context, a *attempt, e ended) ended {
	ctx, cancel := r.commitContext(ctx, a)
	defer cancel()
	dec := decide(e.outcome, a.d.LastAttempt())
	if e.run.transcript.size == 0 {
		cause := ""
		if e.err != nil {
			cause = errorText(e.err)
		}
		line, err := json.Marshal(map[string]any{"type": string(dec.state), "reason": dec.reason, "error": cause, "at": time.Now().UTC()})
		if err != nil {
			e.outcome = classify(stageEnd, err, nil)
			return e
		}
		e.run.transcript = memOutput(transcriptName, append(line, '\n'))
	}
	_, err := r.commitWhenSafe(ctx, a, e.run, nil, e.collected, e.outcome)
	if errors.Is(err, store.ErrWriteRefused) {
		return r.refusedEnd(ctx, a, e, err)
	}
	if err != nil && !errors.Is(err, errLeaseLost) {
		// Not decided: ending the job now could race a stale attempt that commits later.
		e.outcome = classify(stageEnd, fmt.Errorf("record the job as %s: %w", dec.state, err), nil)
		return e
	}
	if err == nil && e.err != nil {
		// The end's manifest and the job term's log line say what the tenant reads (errorText);
		// the worker's side of it (the store's answer, a path, the permission to grant) is
		// this line's, where the tenant's words send the operator.
		a.log.WarnContext(ctx, "the job's end is committed", "state", string(dec.state), "reason", dec.reason, "error", logText(e.err))
	}
	e.outcome = r.endCommitted(ctx, a, nil)
	// Only the delivery that won the arbiter counts the end.
	e.committed = err == nil && (e.end == endDeadLetter || e.end == endDone)
	return e
}

// refusedEnd ends a job whose end's manifest the store refused (refused): not undecided, since
// no delivery of a worker with these credentials could write it, and each would try again, for
// ever. A run committed meanwhile (by a worker the store takes) is the job's end; else the end
// stands as decided, without its manifest (see the top of this file).
func (r *Runner) refusedEnd(ctx context.Context, a *attempt, e ended, refused error) ended {
	dec := decide(e.outcome, a.d.LastAttempt())
	_, err := awaitAnswerTo(ctx, r, a, "the store", "before the job can end", storeAnswered, func(ctx context.Context) (store.ObjectInfo, error) {
		return a.store.Stat(ctx, store.ManifestKey(a.job.ID))
	})
	switch {
	case err == nil:
		e.outcome = r.endCommitted(ctx, a, nil)
	case errors.Is(err, store.ErrNotFound):
		a.log.WarnContext(ctx, "the store refuses the manifest of the job's end; the job ends without one", "state", string(dec.state), "error", refused)
		e.unkept = true
	default:
		e.outcome = classify(stageEnd, fmt.Errorf("record the job as %s: %w", dec.state, err), nil)
	}
	return e
}

// endCommitted ends the job as its committed manifest says (see adopt); cause is the
// attempt's context's, nil where the end runs on a context of its own.
func (r *Runner) endCommitted(ctx context.Context, a *attempt, cause error) outcome {
	return classify(stageEnd, r.adopt(ctx, a), cause)
}

// adopt returns the end the job's committed manifest records, as a committedError, once the
// status follows it: classify makes a failed, rejected or dead run's dead letter of it (once:
// its committer may have died before). Any other error leaves the end undecided.
func (r *Runner) adopt(ctx context.Context, a *attempt) error {
	out, err := r.adoptCommitted(ctx, a)
	if err != nil {
		return fmt.Errorf("%w: %w", errUndecided, err)
	}
	return &committedError{out: out}
}
