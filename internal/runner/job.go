package runner

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"time"

	"github.com/boxcar-run/boxcar/internal/agent"
	"github.com/boxcar-run/boxcar/internal/config"
	"github.com/boxcar-run/boxcar/internal/job"
	"github.com/boxcar-run/boxcar/internal/provenance"
	"github.com/boxcar-run/boxcar/internal/queue"
	"github.com/boxcar-run/boxcar/internal/sandbox"
	"github.com/boxcar-run/boxcar/internal/store"
)

// attempt is one delivery of a job as the runner works on it.
type attempt struct {
	d       *queue.Delivery
	job     job.Job
	profile config.Profile
	limits  config.Limits
	log     *slog.Logger
	cancel  context.CancelCauseFunc // ends the attempt's context
	started time.Time
	sandbox sandbox.Info
	result  agent.Result
	earlier agent.Budget // what earlier attempts had spent when this one started
	began   bool         // the status names this attempt as running: it did work
	// reportKey is the committed report's key; empty when the run committed none (one too
	// large is left out).
	reportKey string
	// collected is what collect could not take as the job left it, for the manifest.
	collected provenance.Collected
	// spool holds the transcript while the agent writes it; transcript is what the commit
	// uploads: the spool's, or the line commitEnd writes for a job that ends without one.
	spool      *spool
	transcript output
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
	a.cancel = cancel
	defer func() {
		if a.spool != nil {
			a.spool.close()
		}
	}()
	unwatch := r.cancels.add(d.JobID, cancel)
	o := r.process(ctx, a)
	unwatch()
	if !o.committed && o.end != endDone && o.end != endLeaseLost && o.end != endCancelled {
		switch cause := context.Cause(ctx); {
		case errors.Is(cause, errCancelled):
			o = outcome{end: endCancelled, err: errCancelled}
		case errors.Is(cause, errShutdown):
			o = outcome{end: endInterrupted, err: errShutdown}
		}
	}
	// A job that ends here with no run committed must still win the arbiter; see end.go.
	if decide(o, d.LastAttempt()).state.Terminal() && !o.committed && job.ValidID(d.JobID) {
		if a.job.ID == "" {
			a.job.ID = d.JobID // a message rejected before it was read as a job
		}
		o = r.commitEnd(ctx, a, o)
	}
	r.settle(ctx, a, o)
}

// process runs the job and returns how this attempt ended.
func (r *Runner) process(ctx context.Context, a *attempt) outcome {
	j, err := job.Decode(a.d.Data)
	if err != nil {
		return outcome{end: endRejected, err: queue.Permanent("invalid_job", err)}
	}
	if a.d.JobID != j.ID {
		return outcome{end: endRejected, err: queue.Permanent("invalid_job", idMismatch(a.d.JobID, j.ID))}
	}
	a.job = j
	a.profile, err = r.cfg.Worker.Profile(j.Profile)
	if err != nil {
		return outcome{end: endRejected, err: queue.Permanent("unknown_profile", err)}
	}
	a.limits = a.profile.Limits.Tighten(j.Limits)
	a.profile.Limits = a.limits

	// From here on the delivery is kept alive, also while the attempt waits for the store or
	// NATS (awaitAnswer).
	stopHeartbeat := a.d.KeepAlive(ctx, r.cfg.HeartbeatInterval)
	defer stopHeartbeat()

	if a.d.Exhausted() {
		return r.exhausted(ctx, a)
	}
	// A redelivery after a crash between commit and ack must not run the job again.
	_, err = awaitAnswer(ctx, r, a, "the store", storeAnswered, func(ctx context.Context) (store.ObjectInfo, error) {
		// No work starts on a server that stopped refusing a second create-only put: its
		// result could not be committed.
		if err := store.Probe(ctx, r.cfg.Store); err != nil {
			return store.ObjectInfo{}, err
		}
		return r.cfg.Store.Stat(ctx, store.ManifestKey(j.ID))
	})
	if err == nil {
		a.log.InfoContext(ctx, "run already committed; acknowledging without running again")
		return r.endCommitted(ctx, a)
	} else if !errors.Is(err, store.ErrNotFound) {
		return outcome{end: endTransient, err: fmt.Errorf("check for a committed run: %w", err)}
	}

	st, err := awaitAnswer(ctx, r, a, "NATS", natsAnswered, func(ctx context.Context) (job.Status, error) {
		return r.cfg.Queue.UpdateStatus(ctx, j.ID, func(s *job.Status) {
			s.State, s.Profile, s.Attempt, s.Worker = job.StateRunning, j.Profile, a.d.Attempt, r.cfg.Worker.WorkerID
			s.StartedAt, s.Progress, s.Error, s.MaxCalls = a.started.UTC(), "starting sandbox", "", a.limits.MaxToolCalls
			if s.QueuedAt.IsZero() {
				s.QueuedAt = j.SubmittedAt
			}
		})
	})
	if errors.Is(err, queue.ErrFinal) && st.State == job.StateCancelled {
		// Cancelled while it waited (submit cancel ends a job that is not running): that end
		// is committed like any other, so that no stale attempt can commit another.
		return outcome{end: endCancelled, err: errCancelled}
	}
	if errors.Is(err, queue.ErrFinal) {
		a.log.InfoContext(ctx, "job already ended; dropping this delivery", "state", st.State)
		return outcome{end: endDone}
	}
	if err != nil {
		return outcome{end: endTransient, err: err}
	}
	a.began = true
	// A cancel requested before this write is in what it read (one after it comes through
	// the worker's watch, cancel.go): asked before this attempt began, it never starts.
	if st.CancelRequested {
		a.cancel(errCancelled)
		return outcome{end: endCancelled, err: errCancelled}
	}
	r.m.QueueWait.WithLabelValues(j.Profile).Observe(a.started.Sub(a.d.Published).Seconds())

	if a.spool, err = r.newSpool(); err != nil {
		return outcome{end: endTransient, err: err}
	}
	sb, err := r.startSandbox(ctx, a)
	if err != nil {
		return outcome{end: endTransient, err: err}
	}
	defer r.closeSandbox(ctx, a, sb)
	copied := r.progressIfSlow(ctx, a, "copying inputs")
	err = r.copyInputs(ctx, a, sb)
	copied()
	if err != nil {
		return fault(err)
	}

	inputs := make([]string, len(j.Inputs))
	for i, in := range j.Inputs {
		inputs[i] = in.Name
	}
	spent := r.newBudget(a, st)
	a.earlier = spent.base
	a.result, err = r.cfg.Agent.Run(ctx, agent.Request{
		JobID:       j.ID,
		ProfileName: j.Profile,
		Profile:     a.profile,
		Task:        j.Task,
		Inputs:      inputs,
		Sandbox:     r.timed(sb),
		Approver:    r.approver(a),
		Spent:       spent.base,
		Progress: func(e agent.Event) {
			spent.progress(ctx, e)
		},
		Transcript: a.spool,
	})
	a.transcript = a.spool.output()
	r.m.ModelTokens.WithLabelValues(j.Profile, "prompt").Add(float64(a.result.Usage.PromptTokens))
	r.m.ModelTokens.WithLabelValues(j.Profile, "completion").Add(float64(a.result.Usage.CompletionTokens))
	r.recordToolCalls(a)
	o := outcome{end: endSucceeded}
	commitCtx := ctx
	switch {
	case errors.Is(context.Cause(ctx), errCancelled):
		// Keep what the job produced until it was stopped.
		o = outcome{end: endCancelled, err: errCancelled}
		var cancel context.CancelFunc
		commitCtx, cancel = context.WithTimeout(context.WithoutCancel(ctx), r.cfg.CleanupTimeout)
		defer cancel()
	case ctx.Err() != nil:
		o = outcome{end: endInterrupted, err: context.Cause(ctx)}
	case errors.Is(err, agent.ErrModelAuth), errors.Is(err, agent.ErrModelRequest):
		o = outcome{end: endFailed, err: queue.Permanent("model_rejected", err)}
	case errors.Is(err, agent.ErrInvalidRequest):
		o = outcome{end: endFailed, err: queue.Permanent("invalid_profile", err)}
	case err != nil:
		o = outcome{end: endTransient, err: err}
	case a.result.Outcome == agent.OutcomeCapped:
		o = outcome{end: endCapped, cap: a.result.Cap}
	}
	// Only a run that ends here is committed: one that will be retried keeps nothing, and the
	// last try of one that keeps failing leaves its transcript behind.
	commits := decide(o, a.d.LastAttempt()).state.Terminal()
	msg := ""
	if commits {
		msg = "uploading"
	}
	// The spending of the run's end goes with the progress line of what comes next: one write.
	said := spent.finish(ctx, a.result.Spent, msg)
	if !commits {
		return o
	}

	uploaded := func() {}
	if !said {
		uploaded = r.progressIfSlow(commitCtx, a, msg)
	}
	outs, o, cerr := r.collect(commitCtx, a, sb, o)
	if cerr == nil {
		cerr = r.commitWhenSafe(commitCtx, a, outs, o)
	}
	uploaded()
	switch {
	case errors.Is(cerr, errLeaseLost):
		a.log.WarnContext(ctx, "another attempt took this job over; discarding this attempt's result", "error", cerr)
		return outcome{end: endLeaseLost, err: cerr}
	case cerr != nil:
		var perm *queue.PermanentError
		if errors.As(cerr, &perm) {
			return outcome{end: endFailed, err: cerr}
		}
		return outcome{end: endTransient, err: fmt.Errorf("upload results: %w", cerr)}
	}
	o.committed = true
	return o
}

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
		rc, err := awaitAnswer(ctx, r, a, "the store", storeAnswered, func(ctx context.Context) (io.ReadCloser, error) {
			return r.cfg.Store.Get(ctx, store.InputKey(in.SHA256))
		})
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
	if _, err := r.cfg.Queue.UpdateStatus(ctx, a.job.ID, func(s *job.Status) { s.Progress = msg }); err != nil && ctx.Err() == nil {
		a.log.WarnContext(ctx, "record progress failed", "error", err)
	}
}

// progressDelay is how long a step runs before its progress line is written: one that ends
// sooner (no inputs to copy, a few small files to upload) would be shown for an instant, at the
// cost of a status write on every job.
const progressDelay = 250 * time.Millisecond

// progressIfSlow writes msg as the job's progress if the step it names is still running after
// progressDelay. The returned done ends the step; it waits for a write in flight, so that it
// never races the attempt's next one.
func (r *Runner) progressIfSlow(ctx context.Context, a *attempt, msg string) (done func()) {
	var wg sync.WaitGroup
	wg.Add(1)
	t := time.AfterFunc(progressDelay, func() {
		defer wg.Done()
		r.progress(ctx, a, msg)
	})
	return func() {
		if t.Stop() {
			wg.Done()
		}
		wg.Wait()
	}
}

// settle acts on the outcome: the status, the queue and the metrics, as decide says. It runs
// on a context that survives shutdown so that an interrupted job is handed back at once.
func (r *Runner) settle(ctx context.Context, a *attempt, o outcome) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), r.cfg.CleanupTimeout)
	defer cancel()
	d, log := a.d, a.log
	dec := decide(o, d.LastAttempt())
	// The metrics label: a name the worker does not define comes from whoever submitted the
	// job, so it must not become a label value.
	profile := a.job.Profile
	if _, ok := r.cfg.Worker.Profiles[profile]; !ok {
		profile = "unknown"
	}

	now := time.Now().UTC()
	if id := r.statusID(ctx, a); dec.state != "" && id != "" {
		_, serr := r.cfg.Queue.UpdateStatus(ctx, id, func(s *job.Status) {
			s.State, s.UpdatedAt, s.Error, s.Cap = dec.state, now, "", a.result.Cap
			// A delivery that did no work (it could not even tell whether the run is
			// committed) leaves the attempt and worker to the one that did.
			if a.began || s.Attempt == 0 {
				s.Attempt, s.Worker = d.Attempt, r.cfg.Worker.WorkerID
			}
			if o.err != nil {
				s.Error = o.err.Error()
			}
			if s.Profile == "" {
				s.Profile = a.job.Profile
			}
			if dec.state.Terminal() {
				s.FinishedAt, s.Progress = now, ""
			}
			if o.committed {
				s.Report, s.Manifest = "", r.cfg.Store.URL(store.ManifestKey(d.JobID))
				if a.reportKey != "" {
					s.Report = r.cfg.Store.URL(a.reportKey)
				}
			}
		})
		if serr != nil && !errors.Is(serr, queue.ErrFinal) {
			log.ErrorContext(ctx, "record outcome failed", "error", serr)
		}
	}

	logAttrs := []any{"outcome", o.end.String(), "duration_ms", time.Since(a.started).Milliseconds()}
	if dec.state != "" {
		logAttrs = append(logAttrs, "state", string(dec.state))
	}
	if o.err != nil {
		logAttrs = append(logAttrs, "error", o.err.Error())
	}
	var qerr error
	switch dec.action {
	case ackJob:
		qerr = d.Ack(ctx)
	case nakNow:
		qerr = d.Nak(ctx, 0)
	case nakLater:
		delay := backoff(time.Duration(r.cfg.Worker.NATS.RetryBackoff), d.Attempt)
		var retry *queue.RetryAfterError
		if errors.As(o.err, &retry) {
			delay = retry.Delay
		}
		logAttrs = append(logAttrs, "retry_in", delay.String())
		qerr = d.Nak(ctx, delay)
	case termJob:
		logAttrs = append(logAttrs, "reason", dec.reason)
		r.m.DeadLetters.WithLabelValues(dec.reason).Inc()
		qerr = d.Term(ctx, dec.reason, o.err)
	}
	if qerr != nil {
		log.ErrorContext(ctx, "settle with the queue failed", "action", dec.action.String(), "error", qerr)
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
	level := slog.LevelInfo
	if o.err != nil {
		level = slog.LevelWarn
	}
	log.Log(ctx, level, "job "+dec.action.String(), logAttrs...)
}

// statusID is the id under which a delivery's outcome is recorded: the message id (the
// Nats-Msg-Id header), or, for a message published without a usable one (no header, an
// uppercase id), the id in its JSON, so that `submit status` can say why it was rejected.
// The JSON id is used only when no status exists under it yet: a message cannot overwrite
// another job's status by naming its id. A message with neither is recorded under its stream
// sequence, seqStatusID, which the publisher's ack reported.
func (r *Runner) statusID(ctx context.Context, a *attempt) string {
	if job.ValidID(a.d.JobID) {
		return a.d.JobID
	}
	var named struct {
		ID string `json:"id"`
	}
	if json.Unmarshal(a.d.Data, &named) == nil && job.ValidID(named.ID) {
		if _, err := r.cfg.Queue.Status(ctx, named.ID); errors.Is(err, queue.ErrUnknownJob) {
			return named.ID
		}
	}
	if a.d.Seq == 0 {
		return ""
	}
	return seqStatusID(a.d.Seq)
}

// seqStatusID is the status id of a rejected message that names no usable job id: its
// sequence in the jobs stream, e.g. stream-seq-42.
func seqStatusID(seq uint64) string { return fmt.Sprintf("stream-seq-%d", seq) }

// idMismatch says precisely how a message's Nats-Msg-Id header fails its JSON id, and how to
// publish it instead.
func idMismatch(header, id string) error {
	if header == "" {
		return fmt.Errorf("%w: the message has no Nats-Msg-Id header; publish it with the header Nats-Msg-Id: %s, the id in its JSON (submit does)", job.ErrInvalid, id)
	}
	return fmt.Errorf("%w: its Nats-Msg-Id header %q is not its JSON id %q; the two must be equal, byte for byte", job.ErrInvalid, header, id)
}

// backoff grows with each attempt from base: base, 2×base, 4×base … capped at 5 minutes.
func backoff(base time.Duration, attempt int) time.Duration {
	return min(base<<min(max(attempt-1, 0), 10), 5*time.Minute)
}
