package runner

import (
	"cmp"
	"context"
	"errors"
	"log/slog"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/boxcar-run/boxcar/internal/job"
	"github.com/boxcar-run/boxcar/internal/queue"
	"github.com/boxcar-run/boxcar/internal/store"
)

// settle acts on how the attempt ended, as decide says: the status, then the queue, then the
// metrics and the log line. An attempt whose status write finds that a later delivery holds
// the job lost its lease: it tells the queue nothing (see settleStatus). Its writes run on a
// context that survives shutdown, so that an interrupted job is handed back at once. The end
// of a job waits for NATS, as its commit did (awaitAnswer; ctx, the worker's, cuts the wait
// short at shutdown): its run is committed, and without the status and the ack `submit wait`
// would wait, and the job, a whole ack wait for a delivery that adopts the run. A job handed
// back does not wait: the server delivers it again anyway.
func (r *Runner) settle(ctx context.Context, a *attempt, e ended) {
	cleanup, cancel := context.WithTimeout(context.WithoutCancel(ctx), r.cfg.CleanupTimeout)
	defer cancel()
	dec := decide(e.outcome, a.d.LastAttempt())
	w := settler{r: r, a: a, ctx: ctx, cleanup: cleanup, wait: dec.state.Terminal()}
	if err := r.settleStatus(w, e, dec); errors.Is(err, errLeaseLost) {
		e.outcome = outcome{end: endLeaseLost, err: err}
		a.leftAsked = nil // a try of the write the later delivery's refused: nothing ended
		dec = decide(e.outcome, a.d.LastAttempt())
	}
	attrs, lettered := r.settleQueue(w, e.outcome, dec)
	r.expireLeftAsked(w, dec)
	r.releaseCancel(w, e.outcome, dec)
	r.settleMetrics(a, dec, lettered)

	attrs = append([]any{"outcome", e.end.String(), "duration_ms", time.Since(a.began).Milliseconds()}, attrs...)
	if dec.state != "" {
		attrs = append(attrs, "state", string(dec.state))
	}
	level := slog.LevelInfo
	if e.err != nil {
		attrs = append(attrs, "error", logText(e.err))
		level = slog.LevelWarn
	}
	a.log.Log(ctx, level, "job "+dec.action.String(), attrs...)
}

// settler makes settle's calls to NATS: all within one CleanupTimeout, or for a job's end
// each try within its own, again until NATS answers.
type settler struct {
	r       *Runner
	a       *attempt
	ctx     context.Context // the worker's: it ends at shutdown
	cleanup context.Context // survives shutdown, for CleanupTimeout
	wait    bool
}

func (w settler) do(answered func(error) bool, call func(context.Context) error) error {
	if !w.wait {
		return call(w.cleanup)
	}
	_, err := awaitAnswerTo(w.ctx, w.r, w.a, "NATS", "before the job can end", answered, func(context.Context) (struct{}, error) {
		ctx, cancel := context.WithTimeout(context.WithoutCancel(w.ctx), w.r.cfg.CleanupTimeout)
		defer cancel()
		return struct{}{}, call(ctx)
	})
	return err
}

// settleStatus records the decided state in the job's status, unless the job ended elsewhere,
// or why the job waits. Every decision that hands the job back (retrying, interrupted,
// waiting) rests on no commit, so its write is the attempt's check that it still holds the job,
// as the commit's is (checkAttempt), made in the write's compare-and-set: the error wraps
// errLeaseLost when a later delivery wrote the status.
func (r *Runner) settleStatus(w settler, e ended, dec decision) error {
	switch id := w.a.statusID(); {
	case id == "":
	case dec.state != "":
		return r.recordState(w, id, e, dec)
	case dec.waiting && e.err != nil:
		return r.recordWaiting(w, id, e.err, e.end == endLeftToPeer)
	}
	return nil
}

// recordState records the decided state in the job's status. The end of a run this attempt
// committed is recorded whoever holds the job now: the committed manifest is the job's end,
// and the status follows it. Any other state only while no later delivery holds the job;
// and a message without a job id of its own only creates a status, never takes one over.
func (r *Runner) recordState(w settler, id string, e ended, dec decision) error {
	a, now := w.a, time.Now().UTC()
	change := func(s *job.Status) {
		s.State, s.UpdatedAt, s.Error, s.Cap = dec.state, now, "", cmp.Or(e.cap, e.run.result.Cap)
		// A delivery that did no work (it could not even tell whether the run is committed)
		// leaves the attempt and worker to the one that did; one whose end is kept in no
		// manifest names itself, for a stale attempt's commit to find (checkAttempt).
		if e.began || s.Attempt == 0 || e.unkept {
			s.Attempt, s.Worker = a.d.Attempt, r.cfg.Worker.WorkerID
		}
		if e.err != nil {
			s.Error = errorText(e.err)
		}
		if s.Profile == "" {
			s.Profile = a.job.Profile
		}
		if c := e.run.claim; !c.at.IsZero() {
			s.SandboxClaimedAt, s.SandboxWarm = c.at.UTC(), c.warm
		}
		if dec.state.Terminal() {
			s.FinishedAt, s.Progress = now, ""
			a.leftAsked = leaveAsked(s, now)
		}
		a.cancelled = a.cancelled || s.CancelRequested // asked once the run could not stop any more
		if e.committed {
			s.Report, s.Manifest = "", a.store.URL(store.ManifestKey(a.d.JobID))
			if e.reportKey != "" {
				s.Report = a.store.URL(e.reportKey)
			}
		}
	}
	var conds []queue.StatusCond
	if !job.ValidID(a.d.JobID) {
		conds = append(conds, queue.OnlyNew)
	}
	err := w.do(natsAnswered, func(ctx context.Context) error {
		if e.committed {
			_, err := r.cfg.Queue.UpdateStatus(ctx, a.ref(id), change)
			return err
		}
		_, err := r.writeStatus(ctx, a, id, change, conds...)
		return err
	})
	switch {
	case err == nil, errors.Is(err, queue.ErrFinal), errors.Is(err, errLeaseLost):
	case errors.Is(err, queue.ErrStatusExists):
		a.log.WarnContext(w.ctx, "a status exists under the id this message is recorded under; its rejection is in the dead letter only", "status_id", id)
	default:
		a.log.ErrorContext(w.ctx, "record outcome failed", "error", err)
	}
	return err
}

// recordWaiting says in the status's progress why the job waits for another delivery, its
// state unchanged; a job without a status yet (one left to a peer at its first delivery) is
// queued. A hand-back to a peer is counted (job.Status.HandedBack).
func (r *Runner) recordWaiting(w settler, id string, cause error, handedBack bool) error {
	err := w.do(natsAnswered, func(ctx context.Context) error {
		_, err := r.writeStatus(ctx, w.a, id, func(s *job.Status) {
			if handedBack {
				// This delivery's hand-back, counted once however many tries the write takes.
				s.HandedBack = max(s.HandedBack, w.a.d.Spared+1)
			}
			s.Progress, s.UpdatedAt = "waiting for another delivery: "+errorText(cause), time.Now().UTC()
			s.Ending = "" // not committed: a cancel asked from now on ends the waiting job
			if s.State == "" {
				s.State, s.Profile, s.QueuedAt = job.StateQueued, w.a.job.Profile, w.a.job.SubmittedAt
			}
		})
		return err
	})
	if err != nil && !errors.Is(err, queue.ErrFinal) && !errors.Is(err, errLeaseLost) {
		w.a.log.ErrorContext(w.ctx, "record why the job waits failed", "error", err)
	}
	return err
}

// settleQueue tells the queue what decide says and returns what the log line adds about it,
// and whether it wrote the job's dead letter: boxcar_dead_letters_total counts the letter
// then, once, and not the term decided at a later delivery that finds it.
func (r *Runner) settleQueue(w settler, o outcome, dec decision) (attrs []any, lettered bool) {
	d := w.a.d
	var call func(context.Context) error
	answered := settled
	switch dec.action {
	case ackJob:
		call = d.Ack
	case nakNow:
		call = func(ctx context.Context) error { return d.Nak(ctx, 0) }
	case nakLater:
		delay := nakDelay(time.Duration(r.cfg.Worker.NATS.RetryBackoff), d.Attempt, o.err)
		attrs = append(attrs, "retry_in", delay.String())
		call = func(ctx context.Context) error { return d.Nak(ctx, delay) }
	case termJob:
		attrs = append(attrs, "reason", dec.reason)
		call = func(ctx context.Context) error {
			wrote, err := d.Term(ctx, dec.reason, boundedError(o.err))
			lettered = lettered || wrote // a try whose term failed may have written it
			return err
		}
		answered = termAnswered
	default:
		return attrs, false
	}
	if err := w.do(answered, call); err != nil {
		w.a.log.ErrorContext(w.ctx, "settle with the queue failed", "action", dec.action.String(), "error", err)
	}
	if lettered {
		r.m.DeadLetters.WithLabelValues(reasonLabel(dec.reason)).Inc()
	}
	return attrs, lettered
}

// releaseCancel lets the cancel request of a job that ended expire: its end is committed, so
// no delivery runs it any more (queue.ReleaseCancel). That is a job that ended cancelled, or
// one a cancel stopped that ended otherwise (a cancel during the upload lets the commit win):
// a request is written with no expiry, and one never released would stay for ever. A request
// it fails to release is kept; the job's next delivery, if any, adopts the end and releases
// it, and a worker's watch releases the request of a job it finds ended (cancelWatch.apply).
func (r *Runner) releaseCancel(w settler, o outcome, dec decision) {
	cancelled := dec.state == job.StateCancelled || o.state == job.StateCancelled || w.a.cancelled && dec.state.Terminal()
	if !cancelled || !job.ValidID(w.a.job.ID) {
		return
	}
	if err := r.cfg.Queue.ReleaseCancel(w.cleanup, w.a.ref(w.a.job.ID)); err != nil {
		w.a.log.WarnContext(w.ctx, "cannot let the cancel request of the ended job expire; it is kept", "error", err)
	}
}

// settled: the server took the ack, nak or term, or this delivery had settled before.
func settled(err error) bool { return err == nil || errors.Is(err, jetstream.ErrMsgAlreadyAckd) }

// termAnswered is settled for a term, or the server refused this login the job's dead letter
// (queue.ErrRefused): a refusal is for good, and tried again until the attempt's deadline it
// held the slot, the job waiting for NATS as if NATS were down. The message is left to its
// ack wait, delivered again (to a worker whose login may write the letter), and not lost.
func termAnswered(err error) bool { return settled(err) || errors.Is(err, queue.ErrRefused) }

// settleMetrics counts the decided end. A message whose subject names no valid job id ends
// at each of its deliveries with no manifest to arbitrate (see process): it is counted with
// the dead letter that one of them writes (lettered), not at each.
func (r *Runner) settleMetrics(a *attempt, dec decision, lettered bool) {
	// The label: a name the worker does not define comes from whoever submitted the job, so
	// it must not become a label value.
	profile := a.job.Profile
	if _, ok := r.cfg.Worker.Profiles[profile]; !ok {
		profile = "unknown"
	}
	if state := dec.counted(); state != "" && (lettered || job.ValidID(a.d.JobID)) {
		r.m.Jobs.WithLabelValues(profile, string(state)).Inc()
		r.m.JobDuration.WithLabelValues(profile, string(state)).Observe(time.Since(a.began).Seconds())
	}
	if dec.capHit != "" {
		r.m.CapHits.WithLabelValues(profile, dec.capHit).Inc()
	}
	if dec.stale {
		r.m.StaleAttempts.Inc()
	}
}
