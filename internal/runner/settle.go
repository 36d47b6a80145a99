package runner

import (
	"cmp"
	"context"
	"errors"
	"log/slog"
	"time"

	"github.com/boxcar-run/boxcar/internal/job"
	"github.com/boxcar-run/boxcar/internal/queue"
	"github.com/boxcar-run/boxcar/internal/store"
)

// settle acts on how the attempt ended, as decide says: the status, then the queue, then the
// metrics and the log line. It runs on a context that survives shutdown so that an
// interrupted job is handed back at once.
func (r *Runner) settle(ctx context.Context, a *attempt, e ended) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), r.cfg.CleanupTimeout)
	defer cancel()
	dec := decide(e.outcome, a.d.LastAttempt())
	r.settleStatus(ctx, a, e, dec)
	attrs := r.settleQueue(ctx, a, e.outcome, dec)
	r.settleMetrics(a, dec)

	attrs = append([]any{"outcome", e.end.String(), "duration_ms", time.Since(a.started).Milliseconds()}, attrs...)
	if dec.state != "" {
		attrs = append(attrs, "state", string(dec.state))
	}
	level := slog.LevelInfo
	if e.err != nil {
		attrs = append(attrs, "error", e.err.Error())
		level = slog.LevelWarn
	}
	a.log.Log(ctx, level, "job "+dec.action.String(), attrs...)
}

// settleStatus records the decided state in the job's status, unless the job ended elsewhere,
// or why the job waits.
func (r *Runner) settleStatus(ctx context.Context, a *attempt, e ended, dec decision) {
	switch id := r.statusID(ctx, a); {
	case id == "":
	case dec.state != "":
		r.recordState(ctx, a, id, e, dec)
	case dec.waiting && e.err != nil:
		r.recordWaiting(ctx, a, id, e.err)
	}
}

// recordState records the decided state in the job's status.
func (r *Runner) recordState(ctx context.Context, a *attempt, id string, e ended, dec decision) {
	now := time.Now().UTC()
	_, err := r.cfg.Queue.UpdateStatus(ctx, a.ref(id), func(s *job.Status) {
		s.State, s.UpdatedAt, s.Error, s.Cap = dec.state, now, "", cmp.Or(e.cap, e.run.result.Cap)
		// A delivery that did no work (it could not even tell whether the run is committed)
		// leaves the attempt and worker to the one that did.
		if e.began || s.Attempt == 0 {
			s.Attempt, s.Worker = a.d.Attempt, r.cfg.Worker.WorkerID
		}
		if e.err != nil {
			s.Error = e.err.Error()
		}
		if s.Profile == "" {
			s.Profile = a.job.Profile
		}
		if c := e.run.claim; !c.at.IsZero() {
			s.SandboxClaimedAt, s.SandboxWarm = c.at.UTC(), c.warm
		}
		if dec.state.Terminal() {
			s.FinishedAt, s.Progress = now, ""
		}
		if e.committed {
			s.Report, s.Manifest = "", a.store.URL(store.ManifestKey(a.d.JobID))
			if e.reportKey != "" {
				s.Report = a.store.URL(e.reportKey)
			}
		}
	})
	if err != nil && !errors.Is(err, queue.ErrFinal) {
		a.log.ErrorContext(ctx, "record outcome failed", "error", err)
	}
}

// recordWaiting says in the status's progress why the job waits for another delivery, its
// state unchanged.
func (r *Runner) recordWaiting(ctx context.Context, a *attempt, id string, cause error) {
	_, err := r.cfg.Queue.UpdateStatus(ctx, a.ref(id), func(s *job.Status) {
		s.Progress, s.UpdatedAt = "waiting for another delivery: "+cause.Error(), time.Now().UTC()
	})
	if err != nil && !errors.Is(err, queue.ErrFinal) {
		a.log.ErrorContext(ctx, "record why the job waits failed", "error", err)
	}
}

// settleQueue tells the queue what decide says and returns what the log line adds about it.
func (r *Runner) settleQueue(ctx context.Context, a *attempt, o outcome, dec decision) []any {
	d := a.d
	var (
		attrs []any
		err   error
	)
	switch dec.action {
	case ackJob:
		err = d.Ack(ctx)
	case nakNow:
		err = d.Nak(ctx, 0)
	case nakLater:
		delay := redeliveryDelay(time.Duration(r.cfg.Worker.NATS.RetryBackoff), d.Attempt)
		var retry *queue.RetryAfterError
		if errors.As(o.err, &retry) {
			delay = retry.Delay
		}
		attrs = append(attrs, "retry_in", delay.String())
		err = d.Nak(ctx, delay)
	case termJob:
		attrs = append(attrs, "reason", dec.reason)
		r.m.DeadLetters.WithLabelValues(dec.reason).Inc()
		err = d.Term(ctx, dec.reason, o.err)
	}
	if err != nil {
		a.log.ErrorContext(ctx, "settle with the queue failed", "action", dec.action.String(), "error", err)
	}
	return attrs
}

// settleMetrics counts the decided end.
func (r *Runner) settleMetrics(a *attempt, dec decision) {
	// The label: a name the worker does not define comes from whoever submitted the job, so
	// it must not become a label value.
	profile := a.job.Profile
	if _, ok := r.cfg.Worker.Profiles[profile]; !ok {
		profile = "unknown"
	}
	if state := dec.counted(); state != "" {
		r.m.Jobs.WithLabelValues(profile, string(state)).Inc()
		r.m.JobDuration.WithLabelValues(profile, string(state)).Observe(time.Since(a.started).Seconds())
	}
	if dec.capHit != "" {
		r.m.CapHits.WithLabelValues(profile, dec.capHit).Inc()
	}
	if dec.stale {
		r.m.StaleAttempts.Inc()
	}
}
