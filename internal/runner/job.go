package runner

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"time"

	"github.com/boxcar-run/boxcar/internal/agent"
	"github.com/boxcar-run/boxcar/internal/config"
	"github.com/boxcar-run/boxcar/internal/job"
	"github.com/boxcar-run/boxcar/internal/queue"
	"github.com/boxcar-run/boxcar/internal/sandbox"
	"github.com/boxcar-run/boxcar/internal/store"
)

// attempt is one delivery of a job as the runner works on it.
type attempt struct {
	d         *queue.Delivery
	job       job.Job
	profile   config.Profile
	limits    config.Limits
	log       *slog.Logger
	started   time.Time
	sandbox   sandbox.Info
	result    agent.Result
	earlier   agent.Budget // what earlier attempts had spent when this one started
	committed bool         // the run's manifest was written by this attempt
	report    bool         // the committed run has a report (one too large is left out)
}

// Handle runs one delivery to its end and settles it with the queue: ack, nak or term. It never
// returns an error: every outcome is recorded on the job.
func (r *Runner) Handle(ctx context.Context, d *queue.Delivery) {
	r.hold(d.JobID, 1)
	defer r.hold(d.JobID, -1)
	a := &attempt{d: d, started: time.Now()}
	a.log = r.log.With("job_id", d.JobID, "attempt", d.Attempt)
	if d.Attempt > 1 {
		r.m.Redeliveries.Inc()
	}
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	stopWatch := r.watchCancel(ctx, d.JobID, cancel)
	state, err := r.process(ctx, a)
	stopWatch()
	if !errors.Is(err, errCommitted) && state != job.StateCancelled {
		switch context.Cause(ctx) {
		case errCancelled:
			state, err = job.StateCancelled, errCancelled
		case errShutdown:
			state, err = job.StateInterrupted, errShutdown
		}
	}
	r.settle(ctx, a, state, err)
}

// watchCancel cancels the job's context when someone asks for the job to be cancelled.
func (r *Runner) watchCancel(ctx context.Context, id string, cancel context.CancelCauseFunc) (stop func()) {
	if !job.ValidID(id) {
		return func() {}
	}
	ctx, stopCtx := context.WithCancel(ctx)
	updates, err := r.cfg.Queue.WatchStatus(ctx, id)
	if err != nil {
		r.log.WarnContext(ctx, "cannot watch for cancellation", "job_id", id, "error", err)
		stopCtx()
		return func() {}
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for st := range updates {
			if st.CancelRequested || st.State == job.StateCancelled {
				cancel(errCancelled)
				return
			}
		}
	}()
	return func() { stopCtx(); <-done }
}

// process runs the job and returns the state it ended in; an error says why it did not succeed
// and, through queue.Permanent or queue.RetryAfter, whether it may be retried.
func (r *Runner) process(ctx context.Context, a *attempt) (job.State, error) {
	j, err := job.Decode(a.d.Data)
	if err != nil {
		return job.StateRejected, queue.Permanent("invalid_job", err)
	}
	if a.d.JobID != j.ID {
		return job.StateRejected, queue.Permanent("invalid_job", fmt.Errorf("%w: message id %q does not match job id %q", job.ErrInvalid, a.d.JobID, j.ID))
	}
	a.job = j
	a.profile, err = r.cfg.Worker.Profile(j.Profile)
	if err != nil {
		return job.StateRejected, queue.Permanent("unknown_profile", err)
	}
	a.limits = a.profile.Limits.Tighten(j.Limits)
	a.profile.Limits = a.limits

	// A redelivery after a crash between commit and ack must not run the job again.
	if _, err := r.cfg.Store.Stat(ctx, store.ManifestKey(j.ID)); err == nil {
		a.log.InfoContext(ctx, "run already committed; acknowledging without running again")
		if err := r.adoptCommitted(ctx, j.ID); err != nil {
			return job.StateRetrying, err
		}
		return "", errCommitted
	} else if !errors.Is(err, store.ErrNotFound) {
		return job.StateRetrying, fmt.Errorf("check for a committed run: %w", err)
	}

	st, err := r.cfg.Queue.UpdateStatus(ctx, j.ID, func(s *job.Status) {
		s.State, s.Profile, s.Attempt, s.Worker = job.StateRunning, j.Profile, a.d.Attempt, r.cfg.Worker.WorkerID
		s.StartedAt, s.Progress, s.Error, s.MaxCalls = a.started.UTC(), "starting sandbox", "", a.limits.MaxToolCalls
		if s.QueuedAt.IsZero() {
			s.QueuedAt = j.SubmittedAt
		}
	})
	if errors.Is(err, queue.ErrFinal) {
		a.log.InfoContext(ctx, "job already ended; dropping this delivery", "state", st.State)
		return "", errCommitted
	}
	if err != nil {
		return job.StateRetrying, err
	}
	r.m.QueueWait.WithLabelValues(j.Profile).Observe(a.started.Sub(a.d.Published).Seconds())

	stopHeartbeat := a.d.KeepAlive(ctx, r.cfg.HeartbeatInterval)
	defer stopHeartbeat()

	sb, err := r.startSandbox(ctx, a)
	if err != nil {
		return job.StateRetrying, err
	}
	defer r.closeSandbox(ctx, a, sb)
	r.progress(ctx, a, "copying inputs")
	if err := r.copyInputs(ctx, a, sb); err != nil {
		var perm *queue.PermanentError
		if errors.As(err, &perm) {
			return job.StateFailed, err
		}
		return job.StateRetrying, err
	}

	r.progress(ctx, a, "running agent")
	inputs := make([]string, len(j.Inputs))
	for i, in := range j.Inputs {
		inputs[i] = in.Name
	}
	spent := r.newBudget(a, st)
	a.earlier = spent.base
	a.result, err = r.cfg.Agent.Run(ctx, agent.Request{
		JobID:    j.ID,
		Profile:  a.profile,
		Task:     j.Task,
		Inputs:   inputs,
		Sandbox:  r.timed(sb),
		Approver: r.approver(a),
		Spent:    spent.base,
		Progress: func(e agent.Event) {
			spent.progress(ctx, e)
		},
	})
	spent.finish(ctx, a.result.Spent)
	r.m.ModelTokens.WithLabelValues(j.Profile, "prompt").Add(float64(a.result.Usage.PromptTokens))
	r.m.ModelTokens.WithLabelValues(j.Profile, "completion").Add(float64(a.result.Usage.CompletionTokens))
	r.recordToolCalls(a)
	state := job.StateSucceeded
	commitCtx := ctx
	switch {
	case context.Cause(ctx) == errCancelled:
		// Keep what the job produced until it was stopped.
		state, err = job.StateCancelled, errCancelled
		var cancel context.CancelFunc
		commitCtx, cancel = context.WithTimeout(context.WithoutCancel(ctx), r.cfg.CleanupTimeout)
		defer cancel()
	case ctx.Err() != nil:
		return job.StateInterrupted, context.Cause(ctx)
	case errors.Is(err, agent.ErrModelAuth), errors.Is(err, agent.ErrModelRequest):
		state, err = job.StateFailed, queue.Permanent("model_rejected", err)
	case errors.Is(err, agent.ErrInvalidRequest):
		state, err = job.StateFailed, queue.Permanent("invalid_profile", err)
	case err != nil:
		if !a.d.LastAttempt() {
			return job.StateRetrying, err
		}
		state = job.StateDead // keep the transcript of the last try, then dead-letter it
	case a.result.Outcome == agent.OutcomeCapped:
		state = job.StateCapped
		r.m.CapHits.WithLabelValues(j.Profile, a.result.Cap).Inc()
	}

	r.progress(commitCtx, a, "uploading")
	outs, dropped, cerr := r.collect(commitCtx, a, sb)
	if cerr == nil {
		state, err = withDroppedReport(state, err, dropped)
		cerr = r.commit(commitCtx, a, outs, state, err)
	}
	if cerr != nil {
		if errors.Is(cerr, store.ErrExists) {
			r.m.StaleAttempts.Inc()
			a.log.WarnContext(ctx, "another attempt committed this job first; discarding this attempt's result")
			return "", errCommitted
		}
		var perm *queue.PermanentError
		if errors.As(cerr, &perm) {
			return job.StateFailed, cerr
		}
		return job.StateRetrying, fmt.Errorf("upload results: %w", cerr)
	}
	a.committed = true
	return state, err
}

// withDroppedReport decides the outcome of a run whose report had to be left out (dropped is
// nil when it was not). A run that would have succeeded or been capped fails with that error,
// as nothing else went wrong and the report is what a user asked for; a run that already
// failed, died or was cancelled keeps its own cause, which came first.
func withDroppedReport(state job.State, err, dropped error) (job.State, error) {
	if dropped == nil || (state != job.StateSucceeded && state != job.StateCapped) {
		return state, err
	}
	return job.StateFailed, dropped
}

// errCommitted means the job's result already exists: acknowledge and record nothing new.
var errCommitted = errors.New("run already committed")

func (r *Runner) startSandbox(ctx context.Context, a *attempt) (sandbox.Sandbox, error) {
	backend := r.cfg.Sandboxes.Backend()
	start := time.Now()
	sb, err := r.cfg.Sandboxes.Start(ctx, sandbox.Spec{JobID: a.job.ID, SandboxSpec: a.profile.Sandbox})
	if err != nil {
		r.m.SandboxFailed.WithLabelValues(backend, "start").Inc()
		if errors.Is(err, sandbox.ErrUnavailable) {
			return nil, queue.RetryAfter(time.Minute, err)
		}
		return nil, fmt.Errorf("start sandbox: %w", err)
	}
	r.m.SandboxStart.WithLabelValues(backend).Observe(time.Since(start).Seconds())
	a.sandbox = sb.Info()
	a.log.InfoContext(ctx, "sandbox ready", "backend", backend, "sandbox_id", a.sandbox.ID, "duration_ms", time.Since(start).Milliseconds())
	return sb, nil
}

// closeSandbox always runs, on a context that survives shutdown, so no sandbox outlives its job.
func (r *Runner) closeSandbox(ctx context.Context, a *attempt, sb sandbox.Sandbox) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), r.cfg.CleanupTimeout)
	defer cancel()
	start := time.Now()
	backend := r.cfg.Sandboxes.Backend()
	if err := sb.Close(ctx); err != nil {
		r.m.SandboxFailed.WithLabelValues(backend, "close").Inc()
		a.log.ErrorContext(ctx, "close sandbox failed", "error", err)
		return
	}
	r.m.SandboxClose.WithLabelValues(backend).Observe(time.Since(start).Seconds())
}

// copyInputs moves each input from the store into the workdir, checking size and digest.
func (r *Runner) copyInputs(ctx context.Context, a *attempt, sb sandbox.Sandbox) error {
	for _, in := range a.job.Inputs {
		rc, err := r.cfg.Store.Get(ctx, store.InputKey(in.SHA256))
		if errors.Is(err, store.ErrNotFound) {
			return queue.Permanent("input_missing", fmt.Errorf("input %s (sha256 %s) is not in the store; submit it again", in.Name, in.SHA256))
		}
		if err != nil {
			return fmt.Errorf("fetch input %s: %w", in.Name, err)
		}
		data, err := io.ReadAll(io.LimitReader(rc, in.Size+1))
		rc.Close()
		if err != nil {
			return fmt.Errorf("read input %s: %w", in.Name, err)
		}
		sum := sha256.Sum256(data)
		if int64(len(data)) != in.Size || hex.EncodeToString(sum[:]) != in.SHA256 {
			return queue.Permanent("input_digest_mismatch", fmt.Errorf("input %s does not match its digest or size: the stored object changed", in.Name))
		}
		if err := sb.WriteFile(ctx, in.Name, data); err != nil {
			return fmt.Errorf("copy input %s into the sandbox: %w", in.Name, err)
		}
	}
	return nil
}

func (r *Runner) progress(ctx context.Context, a *attempt, msg string) {
	r.progressCalls(ctx, a, msg, -1)
}

func (r *Runner) progressCalls(ctx context.Context, a *attempt, msg string, calls int) {
	if _, err := r.cfg.Queue.UpdateStatus(ctx, a.job.ID, func(s *job.Status) {
		s.Progress = msg
		if calls >= 0 {
			s.ToolCalls = calls
		}
	}); err != nil && ctx.Err() == nil {
		a.log.WarnContext(ctx, "record progress failed", "error", err)
	}
}

// settle turns the outcome into a queue action and a final status. It runs on a context that
// survives shutdown so that an interrupted job is handed back at once.
func (r *Runner) settle(ctx context.Context, a *attempt, state job.State, err error) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), r.cfg.CleanupTimeout)
	defer cancel()
	d, log := a.d, a.log
	// The metrics label: a name the worker does not define comes from whoever submitted the
	// job, so it must not become a label value.
	profile := a.job.Profile
	if _, ok := r.cfg.Worker.Profiles[profile]; !ok {
		profile = "unknown"
	}
	if errors.Is(err, errCommitted) {
		if aerr := d.Ack(ctx); aerr != nil {
			log.ErrorContext(ctx, "ack failed", "error", aerr)
		}
		return
	}

	var perm *queue.PermanentError
	var retry *queue.RetryAfterError
	action := "ack"
	switch {
	case state == job.StateInterrupted:
		action = "nak-now"
	case errors.As(err, &perm):
		action = "term"
	case state == job.StateRetrying && d.LastAttempt():
		state, action = job.StateDead, "term"
	case state == job.StateRetrying:
		action = "nak"
	case state == job.StateDead, state == job.StateFailed && err != nil:
		action = "term"
	}

	now := time.Now().UTC()
	if job.ValidID(d.JobID) {
		_, serr := r.cfg.Queue.UpdateStatus(ctx, d.JobID, func(s *job.Status) {
			s.State, s.Attempt, s.Worker, s.UpdatedAt = state, d.Attempt, r.cfg.Worker.WorkerID, now
			s.Error, s.Cap = "", a.result.Cap
			if err != nil {
				s.Error = err.Error()
			}
			if s.Profile == "" {
				s.Profile = a.job.Profile
			}
			if state.Terminal() {
				s.FinishedAt, s.Progress = now, ""
			}
			if a.committed {
				s.Report, s.Manifest = "", r.cfg.Store.URL(store.ManifestKey(d.JobID))
				if a.report {
					s.Report = r.cfg.Store.URL(store.ReportKey(d.JobID))
				}
			}
		})
		if serr != nil && !errors.Is(serr, queue.ErrFinal) {
			log.ErrorContext(ctx, "record outcome failed", "error", serr)
		}
	}

	logAttrs := []any{"state", string(state), "duration_ms", time.Since(a.started).Milliseconds()}
	if err != nil {
		logAttrs = append(logAttrs, "error", err.Error())
	}
	var qerr error
	switch action {
	case "ack":
		qerr = d.Ack(ctx)
	case "nak-now":
		qerr = d.Nak(ctx, 0)
	case "nak":
		delay := backoff(time.Duration(r.cfg.Worker.NATS.RetryBackoff), d.Attempt)
		if errors.As(err, &retry) {
			delay = retry.Delay
		}
		logAttrs = append(logAttrs, "retry_in", delay.String())
		qerr = d.Nak(ctx, delay)
	case "term":
		reason := failureReason(state, err)
		logAttrs = append(logAttrs, "reason", reason)
		r.m.DeadLetters.WithLabelValues(reason).Inc()
		qerr = d.Term(ctx, reason, err)
	}
	if qerr != nil {
		log.ErrorContext(ctx, "settle with the queue failed", "action", action, "error", qerr)
	}
	if state.Terminal() {
		r.m.Jobs.WithLabelValues(profile, string(state)).Inc()
		r.m.JobDuration.WithLabelValues(profile, string(state)).Observe(time.Since(a.started).Seconds())
	}
	level := slog.LevelInfo
	if err != nil {
		level = slog.LevelWarn
	}
	log.Log(ctx, level, "job "+action, logAttrs...)
}

// failureReason is the short machine-readable reason of a job that ends in the dead letter
// stream: the dead letter and the manifest's outcome both carry it.
func failureReason(state job.State, err error) string {
	var perm *queue.PermanentError
	switch {
	case errors.As(err, &perm):
		return perm.Reason
	case state == job.StateDead:
		return "max_deliveries"
	}
	return "failed"
}

// backoff grows with each attempt from base: base, 2×base, 4×base … capped at 5 minutes.
func backoff(base time.Duration, attempt int) time.Duration {
	return min(base<<min(max(attempt-1, 0), 10), 5*time.Minute)
}
