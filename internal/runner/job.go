package runner

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"runtime/debug"
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

// attempt is one delivery of a job as the runner works on it: what admit read, fixed from
// then on. What the stages produce they return (ran, collection, ended); nothing else is
// kept here.
type attempt struct {
	d       *queue.Delivery
	job     job.Job
	profile config.Profile
	limits  config.Limits
	log     *slog.Logger
	cancel  context.CancelCauseFunc // ends the attempt's context
	// started is when the attempt began on the worker's wall clock (Config.Now), for what it
	// records (its status, its manifest's timings, its queue wait); began is the same moment
	// on the process's clock, which every bound and duration of the attempt is measured on
	// (time.Now, as the contexts' deadlines are): the two differ where Now is not time.Now.
	started, began time.Time
	// deadline is when every wait of the attempt gives up (awaitAnswer), set by admit:
	// the run's job_timeout, and as long again for all its waits together.
	deadline time.Time
	// tenant is the job's tenant, from the subject it came on (bindTenant); grant is what the
	// worker config grants it, set by admit.
	tenant string
	grant  config.Tenant
	// store is the tenant's store: every object of the attempt is read and written there.
	// nil for a tenant name that cannot be a folder, whose job ends without a manifest.
	store store.Store
	// ownBucket: store is a bucket of the tenant's own (tenants.T.bucket), which serves no
	// other tenant.
	ownBucket bool
	// phases times the attempt's stages for the manifest (phases.go).
	phases phaseClock
	// cancelled: a cancel of the job was asked while the attempt held it (it stopped the
	// attempt, or the status the end was written over says so); its request is then released
	// when the job ends, whatever the end (releaseCancel).
	cancelled bool
	// leftAsked: the approval requests the job's terminal status write found asked and
	// neither expired nor past their expiry, which no delivery will wait on any more
	// (expireLeftAsked).
	leftAsked []string
	// release stops the delivery's heartbeats once the attempt has settled it (keepDelivery);
	// nil while none run.
	release func()
	// at is the stage in progress, for a panic in it (survive): the one after the last lap.
	at stage
}

// ref names a job of the attempt's tenant: its own, or the id its outcome is recorded under
// (statusID).
func (a *attempt) ref(id string) queue.Ref { return queue.Ref{Tenant: a.d.Tenant, ID: id} }

// ran is what the run stage produced, for collect and the commit.
type ran struct {
	sandbox sandbox.Info
	result  agent.Result
	earlier agent.Budget // what earlier attempts had spent when this one started
	// transcript is what the commit uploads: the spool's, or the line commitEnd writes for a
	// job that ends without one.
	transcript output
	egress     *provenance.Egress // what the job's network carried; nil without one
	claim      claimed
	// usage is what the sandbox's processes used, read when the agent was done.
	usage *provenance.SandboxUsage
}

// claimed is how the attempt came by its sandbox: warm (from a pool) or started for it, and
// when it had it.
type claimed struct {
	warm bool
	at   time.Time
}

// ended is how an attempt ended and what settle and commitEnd need of it.
type ended struct {
	outcome
	run ran // zero when no agent ran
	// collected is what collect could not take as the job left it, for the manifest.
	collected provenance.Collected
	began     bool // the status names this attempt as running: it did work
	// unkept: the job ends here without a manifest, which the store refused (see end.go); the
	// status names this attempt, whose end it is, so a stale attempt's commit loses to it.
	unkept bool
	// reportKey is the committed report's key; empty when the run committed none.
	reportKey string
}

// Handle runs one delivery to its end and settles it with the queue: ack, nak or term. It never
// returns an error: every outcome is recorded on the job.
func (r *Runner) Handle(ctx context.Context, d *queue.Delivery) { r.work(ctx, d)() }

// work runs one delivery up to its settling, which it returns: the status and the queue's
// answer (settle). The worker's slot is free once the work is done (Run): the sandbox is closed
// and the run committed (or the attempt ended without one) before it returns, and a worker that
// stops before the settling is done leaves a delivery that the next one adopts.
func (r *Runner) work(ctx context.Context, d *queue.Delivery) (settle func()) {
	r.hold(d.JobID, 1)
	a := &attempt{d: d, started: r.cfg.Now(), began: time.Now(), at: stageAdmit}
	r.bindTenant(a)
	a.log = r.log.With("job_id", d.JobID, "tenant", a.tenant, "attempt", d.Attempt)
	if d.Attempt > 1 {
		r.m.Redeliveries.Inc()
	}
	worker := ctx
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	a.cancel = cancel
	// The transcript's spool outlives process: a run that could not commit leaves it to
	// commitEnd.
	var sp *spool
	defer func() {
		if sp != nil {
			sp.close()
		}
	}()
	e := r.process(ctx, a, &sp)
	// A job that ends here with no run committed must still win the arbiter, unless the store
	// refuses every write of it; see end.go. A refusal after a put of the run's manifest that
	// may have been stored is no such end: the end looks for that manifest first (commitEnd).
	if decide(e.outcome, d.LastAttempt()).state.Terminal() && !e.committed && job.ValidID(d.JobID) && a.store != nil {
		if errors.Is(e.err, store.ErrWriteRefused) && !errors.Is(e.err, store.ErrMaybeStored) {
			e.unkept = true
		} else {
			e = r.end(ctx, a, e)
		}
	}
	a.cancelled = errors.Is(context.Cause(ctx), errCancelled)
	return func() {
		defer r.hold(d.JobID, -1)
		if a.release != nil {
			defer a.release()
		}
		defer a.surviveSettle(worker)
		r.settle(worker, a, e)
	}
}

// end commits the end of a job that ends with no run committed (claimEnd, commitEnd). A panic
// in it leaves the end undecided (survive): the job's next delivery tries again.
func (r *Runner) end(ctx context.Context, a *attempt, e ended) (out ended) {
	a.at, out = stageEnd, e
	defer a.survive(ctx, &out)
	if a.job.ID == "" {
		a.job.ID = a.d.JobID // a message rejected before it was read as a job
	}
	if a.release == nil {
		// Refused at admit: kept alive from here, as the end may wait for the store.
		a.release = r.keepDelivery(ctx, a)
	}
	if out = r.claimEnd(ctx, a, out); decide(out.outcome, a.d.LastAttempt()).state.Terminal() {
		out = r.commitEnd(ctx, a, out)
	}
	return out
}

// keepDelivery keeps the delivery from being delivered again (its heartbeats) until the
// returned release, called once the attempt has settled it, whatever becomes of the attempt's
// context: a cancelled or interrupted attempt still collects, commits, closes its sandbox and
// settles, and a delivery left without heartbeats meanwhile is delivered again beside it (a
// cancelled run's commit then loses to a one-line end, or to `dead` on the last delivery).
// The heartbeats stop by themselves when the attempt lost its lease (a later delivery holds
// the job, and a heartbeat is the message's, not the delivery's), and at the attempt's
// deadline plus twice CleanupTimeout (a commit that reached the deadline, commitBy, then the
// sandbox's close and the settling): an attempt stuck past every bound leaves its job to
// another delivery, which its commit, if it ever comes, loses to.
func (r *Runner) keepDelivery(ctx context.Context, a *attempt) (release func()) {
	bound := later(a.deadline, time.Now()).Add(2 * r.cfg.CleanupTimeout)
	keep, stop := context.WithDeadline(context.WithoutCancel(ctx), bound)
	unwatch := context.AfterFunc(ctx, func() {
		if errors.Is(context.Cause(ctx), errLeaseLost) {
			stop()
		}
	})
	beating := make(chan struct{})
	a.goGuarded(ctx, "heartbeats", func() {
		defer close(beating)
		r.cfg.heartbeat(a.d, keep, r.cfg.HeartbeatInterval)
	})
	return func() {
		unwatch()
		stop()
		<-beating
	}
}

// later is the later of two times.
func later(t, u time.Time) time.Time {
	if t.After(u) {
		return t
	}
	return u
}

// process runs the attempt's stages in order and returns how it ended. Each stage returns
// its product and an error; classify alone turns an error into an ending, with the cause of
// the attempt's context as it is when the error is seen (classifyIn). A cancel stops the
// attempt until its run is over, not after: the commit of a finished run wins over it. A
// panic in a stage ends the attempt as that stage's failure (survive, deferred first so that
// it runs last): the sandbox is closed, the worker goes on.
func (r *Runner) process(ctx context.Context, a *attempt, sp **spool) (e ended) {
	defer a.survive(ctx, &e)
	r.cancels.before(ctx, a.d.Ref())
	unwatch := r.cancels.add(a.d.Ref(), a.cancel)
	defer unwatch()
	r.spareHandBacks(ctx, a)
	err := r.admit(a)
	a.lap(stageAdmit)
	if err != nil {
		r.cancelAsked(ctx, a)
		return ended{outcome: r.leaveToPeer(ctx, a, classifyIn(ctx, stageAdmit, err))}
	}
	// From here on the delivery is kept alive until it is settled (work), also while the
	// attempt waits for the store or NATS (awaitAnswer).
	a.release = r.keepDelivery(ctx, a)

	st, err := r.claim(ctx, a)
	a.lap(stageClaim)
	began := st.State == job.StateRunning
	e.began = began // for a panic from here on
	if err != nil {
		return ended{outcome: classifyIn(ctx, stageClaim, err), began: began}
	}
	sb, cl, err := r.prepare(ctx, a)
	if err != nil {
		return ended{outcome: classifyIn(ctx, stagePrepare, err), began: began}
	}
	defer r.closeSandbox(ctx, a, sb)
	je, err := r.startEgress(ctx, a, sb)
	if err != nil {
		return ended{outcome: classifyIn(ctx, stagePrepare, err), began: began}
	}
	defer je.close()
	a.lap(stagePrepare)
	*sp = r.newSpool()
	run, spent, err := r.run(ctx, a, sb, cl, je, st, *sp)
	a.lap(stageRun)
	unwatch()
	e = ended{outcome: classifyIn(ctx, stageRun, err), run: run, began: began}
	// Only a run that ends here is committed: one that will be retried keeps nothing, and the
	// last try of one that keeps failing leaves its transcript behind.
	commits := decide(e.outcome, a.d.LastAttempt()).state.Terminal()
	msg := ""
	if commits {
		msg = "uploading"
	}
	// The spending of the run's end goes with the progress line of what comes next: one write.
	said := spent.finish(ctx, run.result.Spent, msg)
	if !commits {
		return e
	}
	return r.commitRun(ctx, a, sb, e, said)
}

// admit reads the delivery as a job of a profile this worker defines, with its limits, and
// refuses one the profile cannot take: a network wider than its own, inputs larger than its
// max_input_bytes. Each of those is decided by this worker's config, which another worker's may
// not share (leaveToPeer).
func (r *Runner) admit(a *attempt) error {
	j, err := job.Decode(a.d.Data)
	if err != nil {
		return err
	}
	if a.d.JobID != j.ID {
		return idMismatch(a.d.JobID, j.ID, r.cfg.Worker.NATS.Subject+"."+a.tenant+"."+j.ID)
	}
	// The tenant is the subject's: one the payload claims is not an identity.
	j.Tenant = a.tenant
	a.job = j
	if a.grant, a.profile, err = r.cfg.Worker.Grant(a.tenant, j.Profile); err != nil {
		return err
	}
	if err := narrowsNetwork(j, a.profile); err != nil {
		return err
	}
	a.limits = a.profile.Limits.Tighten(j.Limits)
	a.profile.Limits = a.limits
	a.deadline = a.began.Add(2 * time.Duration(a.limits.JobTimeout))
	return checkInputSize(a)
}

// claim makes sure the job is this attempt's to run: not exhausted, not committed, not ended
// or cancelled, and records it as running. It returns the status it wrote, or, when the
// write found the job ended, the status it found.
func (r *Runner) claim(ctx context.Context, a *attempt) (job.Status, error) {
	// Each call ends by the attempt's deadline, whatever it waits for; its waits for an
	// outage give up sooner (awaitAnswer).
	ctx, cancel := context.WithDeadline(ctx, a.deadline)
	defer cancel()
	if a.d.Exhausted() {
		return job.Status{}, r.exhausted(ctx, a)
	}
	// A redelivery after a crash between commit and ack must not run the job again.
	_, err := awaitAnswer(ctx, r, a, "the store", storeAnswered, func(ctx context.Context) (store.ObjectInfo, error) {
		return committedRun(ctx, a)
	})
	if err == nil {
		a.log.InfoContext(ctx, "run already committed; acknowledging without running again")
		return job.Status{}, r.adopt(ctx, a)
	} else if !errors.Is(err, store.ErrNotFound) {
		return job.Status{}, fmt.Errorf("check for a committed run: %w", err)
	}

	j := a.job
	write := r.cfg.Queue.UpdateStatus
	if a.d.Attempt == 1 {
		write = r.cfg.Queue.UpdateNewStatus
	}
	asked, err := r.cancelOutlived(ctx, a)
	if err != nil {
		return job.Status{}, err
	}
	st, err := awaitAnswer(ctx, r, a, "NATS", natsAnswered, func(ctx context.Context) (job.Status, error) {
		// Held to this delivery's attempt, as every later write is: a delivery that paused
		// before its claim must not take the status back from a later one that runs the job.
		return write(ctx, a.ref(j.ID), func(s *job.Status) {
			s.ClearAttempt()
			s.State, s.Profile, s.Attempt, s.Worker = job.StateRunning, j.Profile, a.d.Attempt, r.cfg.Worker.WorkerID
			s.StartedAt, s.Progress, s.Error, s.MaxCalls = a.started.UTC(), "starting sandbox", "", a.limits.MaxToolCalls
			if s.QueuedAt.IsZero() {
				s.QueuedAt = j.SubmittedAt
			}
			s.Labels = j.Labels // for `submit list --label`: submit writes no status
			if asked {
				job.RequestCancel(s)
			}
		}, queue.ByAttempt(a.d.Attempt))
	})
	switch {
	case errors.Is(err, queue.ErrSuperseded):
		a.log.InfoContext(ctx, "a later delivery holds the job; leaving it to that delivery", "holder", st.Attempt)
		return st, fmt.Errorf("%w: %w", errLeaseLost, err)
	case errors.Is(err, queue.ErrFinal) && st.State == job.StateCancelled:
		// Cancelled while it waited (submit cancel ends a job that is not running): that end
		// is committed like any other, so that no stale attempt can commit another.
		return st, errCancelled
	case errors.Is(err, queue.ErrFinal):
		a.log.InfoContext(ctx, "job already ended; this delivery ends with it (a dead letter written if its end has one and it is missing)", "state", st.State)
		return st, &endedError{tenant: a.d.Tenant, st: st}
	case err != nil:
		return job.Status{}, err
	case st.CancelRequested:
		// A cancel requested before this write is in what it read (one after it comes
		// through the worker's watch, cancel.go): asked before this attempt began, it never
		// starts.
		a.cancel(errCancelled)
		return st, errCancelled
	}
	// The message's time is the NATS server's clock, the start the worker's: one behind the
	// server's would read a wait below zero, which a histogram's sum must never add.
	r.m.QueueWait.WithLabelValues(j.Profile).Observe(max(a.started.Sub(a.d.Published), 0).Seconds())
	return st, nil
}

// committedRun is the job's committed manifest, else store.ErrNotFound once the store is
// proven to take the run's commit. No work starts on a server that stopped refusing a second
// create-only put, nor where the store refuses the tenant's writes: its result could not be
// committed. A committed run is adopted whatever the store takes now, so it is looked for first.
func committedRun(ctx context.Context, a *attempt) (store.ObjectInfo, error) {
	info, err := a.store.Stat(ctx, store.ManifestKey(a.job.ID))
	if !errors.Is(err, store.ErrNotFound) {
		return info, err
	}
	if err := store.Probe(ctx, a.store); err != nil {
		return store.ObjectInfo{}, err
	}
	return info, err
}

// cancelOutlived reports whether a cancel was asked for a job whose message may have waited
// longer than status_ttl (job.ClockSkew less, on the worker's clock): a cancelled status written while it waited may have expired since, and the
// cancel request, kept until the job's end is committed (queue.ReleaseCancel), says. A younger
// message's status, if a cancel made one, is still there for the claim's write to find.
func (r *Runner) cancelOutlived(ctx context.Context, a *attempt) (bool, error) {
	// Published is the NATS server's clock, the one that expires the status; the worker's may
	// be behind it by up to job.ClockSkew and read the wait as that much shorter.
	if r.cfg.Now().Sub(a.d.Published) < time.Duration(r.cfg.Worker.NATS.StatusTTL)-job.ClockSkew {
		return false, nil
	}
	return awaitAnswer(ctx, r, a, "NATS", natsAnswered, func(ctx context.Context) (bool, error) {
		return r.cfg.Queue.CancelAsked(ctx, a.ref(a.job.ID))
	})
}

// prepare starts the sandbox and copies the inputs into it. The caller closes the sandbox
// when prepare returns one; on an error it closed it already. It gives up when the run must
// start to keep its whole job_timeout (beforeRun), as the waits before the run do: a store that
// stops sending an input mid-body, or a start that never ends, would otherwise hold the job
// and its slot for ever, its heartbeats going on.
func (r *Runner) prepare(ctx context.Context, a *attempt) (sandbox.Sandbox, claimed, error) {
	ctx, cancel := beforeRun(ctx, a)
	defer cancel()
	if err := r.checkInputs(a); err != nil {
		return nil, claimed{}, err
	}
	sb, cl, err := r.startSandbox(ctx, a)
	if err != nil {
		return nil, claimed{}, startedLate(ctx, err)
	}
	// Closed on every way out but success, a panic in the copy included.
	ready := false
	defer func() {
		if !ready {
			r.closeSandbox(ctx, a, sb)
		}
	}()
	copied := r.progressIfSlow(ctx, a, "copying inputs")
	err = r.copyInputs(ctx, a, sb)
	copied()
	if err != nil {
		return nil, claimed{}, startedLate(ctx, err)
	}
	ready = true
	return sb, cl, nil
}

// beforeRun bounds a stage before the run (the sandbox's start, the input copy, the egress
// attach) by when the run must start to keep its whole job_timeout (startBy).
func beforeRun(ctx context.Context, a *attempt) (context.Context, context.CancelFunc) {
	return context.WithDeadlineCause(ctx, a.startBy(), &lateStartError{jobTimeout: time.Duration(a.limits.JobTimeout)})
}

// lateStartError is the cause of a stage's context that reached startBy (beforeRun).
type lateStartError struct{ jobTimeout time.Duration }

func (e *lateStartError) Error() string {
	return fmt.Sprintf("not done when the run had to start to keep its whole job_timeout (%s)", e.jobTimeout)
}

// startedLate says, of err from a stage bounded by beforeRun, that the stage ran out of time
// when that is what ended it: "context deadline exceeded" alone does not say which bound.
func startedLate(ctx context.Context, err error) error {
	var late *lateStartError
	if err != nil && errors.As(context.Cause(ctx), &late) {
		return fmt.Errorf("%w: %w", err, late)
	}
	return err
}

// run is the agent loop over the prepared sandbox, its transcript spooled to sp, and the
// job's network through je (nil without one). It returns what the run produced, the budget it
// kept in the status (for its last write), and the agent's error, or a capError for a run a
// cap stopped.
func (r *Runner) run(ctx context.Context, a *attempt, sb sandbox.Sandbox, cl claimed, je *jobEgress, st job.Status, sp *spool) (ran, *budget, error) {
	j := a.job
	inputs := make([]string, len(j.Inputs))
	for i, in := range j.Inputs {
		inputs[i] = in.Name
	}
	spent := r.newBudget(a, st)
	spent.claim = &cl
	watch := watchLoss(r.timed(je.wrap(sb)))
	// The egress lines come after the run's, within the same max_transcript_bytes (jobEgress.end).
	profile := a.profile
	profile.Limits.MaxTranscriptBytes -= je.reserve(profile.Limits.MaxTranscriptBytes)
	res, err := runAgent(ctx, a, r.cfg.Agent, agent.Request{
		JobID:       j.ID,
		Logger:      a.log,
		ProfileName: j.Profile,
		Profile:     profile,
		Task:        j.Task,
		Inputs:      inputs,
		Sandbox:     watch,
		Approver:    r.approver(a),
		Spent:       spent.base,
		Meter:       r.meter(a),
		Progress: func(e agent.Event) {
			spent.progress(ctx, e)
		},
		Transcript: sp,
	})
	err = runLost(watch, err)
	egressSeen := je.end(a.log, sp, a.limits.MaxTranscriptBytes) // its lines go into the transcript before it is taken
	run := ran{sandbox: sb.Info(), result: res, earlier: spent.base, transcript: sp.output(), egress: egressSeen, claim: cl, usage: sandboxUsage(sb)}
	r.m.ModelTokens.WithLabelValues(j.Profile, "prompt").Add(float64(res.Usage.PromptTokens))
	r.m.ModelTokens.WithLabelValues(j.Profile, "completion").Add(float64(res.Usage.CompletionTokens))
	r.m.ModelTokensEstimated.WithLabelValues(j.Profile).Add(float64(estimatedTokens(res.Calls)))
	r.recordToolCalls(a, res)
	if err == nil && res.Outcome == agent.OutcomeCapped {
		err = &capError{cap: res.Cap}
	}
	return run, spent, err
}

// runAgent runs the agent on one job and turns a panic in it into the job's failure
// (errAgentPanicked), logged with its stack: the worker's other jobs, and the worker that would
// take this job's redelivery, go on.
func runAgent(ctx context.Context, a *attempt, ag Agent, req agent.Request) (res agent.Result, err error) {
	defer func() {
		if p := recover(); p != nil {
			a.log.ErrorContext(ctx, "the agent panicked; the job fails and the worker goes on", "panic", fmt.Sprint(p), "stack", string(debug.Stack()))
			res, err = agent.Result{}, fmt.Errorf("%w: %v", errAgentPanicked, p)
		}
	}()
	return ag.Run(ctx, req)
}

// commitRun collects what the run left and commits it. A cancel asked once the run is over
// does not reach it (process stops watching): the run is done, its commit wins. A run
// cancelled before keeps what it produced until it was stopped: its commit runs on a context
// that survives the cancel. A shutdown still cuts the commit short, and each failure is
// classified by the cause of the attempt's context as it is when the failure is seen: an
// upload cut short by the drain grace is an interrupted attempt, not a transient fault.
func (r *Runner) commitRun(ctx context.Context, a *attempt, sb sandbox.Sandbox, e ended, said bool) ended {
	attemptCtx := ctx
	ctx, cancel := r.commitContext(ctx, a)
	defer cancel()
	uploaded := func() {}
	if !said {
		uploaded = r.progressIfSlow(ctx, a, "uploading")
	}
	defer uploaded()
	c, err := r.collect(ctx, a, sb, e.run, e.outcome)
	a.lap(stageCollect)
	if err != nil {
		e.outcome = classifyIn(attemptCtx, stageCollect, err)
		return e
	}
	e.collected = c.collected
	key, err := r.commitWhenSafe(ctx, a, e.run, c.outs, c.collected, c.outcome)
	if err != nil {
		if errors.Is(err, errLeaseLost) {
			a.log.WarnContext(ctx, "another attempt took this job over; discarding this attempt's result", "error", err)
		}
		e.outcome = classifyIn(attemptCtx, stageCommit, step(errUpload, err))
		return e
	}
	e.outcome, e.reportKey = c.outcome, key
	e.committed = true
	return e
}

// commitContext is the context of the attempt's collect and commit, or of the commit of its
// end: every call of theirs, a store that stops reading mid-body included, ends by commitBy,
// and what was not done by then is the store still down at the attempt's deadline (retrying,
// or dead on the last delivery). A cancelled attempt commits on a context that survives the
// cancel, for CleanupTimeout: a run cancelled before keeps what it produced, and a cancelled
// end is what it commits; so does an attempt a goroutine's panic stopped (goGuarded), whose
// end is worker_panicked. A shutdown or a lost lease still cuts the commit short.
func (r *Runner) commitContext(ctx context.Context, a *attempt) (context.Context, context.CancelFunc) {
	if cause := context.Cause(ctx); errors.Is(cause, errCancelled) || errors.Is(cause, errWorkerPanicked) {
		return context.WithTimeout(context.WithoutCancel(ctx), r.cfg.CleanupTimeout)
	}
	return context.WithDeadline(ctx, r.commitBy(a))
}

// commitBy is when the attempt's commit gives up: its deadline, or CleanupTimeout from now for
// one that reaches it with less left (its run took its whole job_timeout after its start
// waited, or it was refused before it had a deadline): a finished run gets as long to commit
// as a cancelled one.
func (r *Runner) commitBy(a *attempt) time.Time {
	return later(a.deadline, time.Now().Add(r.cfg.CleanupTimeout))
}

// startSandbox takes the job's sandbox from the pool (warm or started for it) or, without a
// pool, starts it.
func (r *Runner) startSandbox(ctx context.Context, a *attempt) (sandbox.Sandbox, claimed, error) {
	backend := r.cfg.Sandboxes.Backend()
	start := time.Now()
	spec := sandbox.Spec{JobID: a.job.ID, Tenant: a.tenant, SandboxSpec: a.profile.Sandbox}
	taken, err := r.startWhenAvailable(ctx, a, func(ctx context.Context) (takenSandbox, error) {
		if r.cfg.Pool != nil {
			sb, warm, err := r.cfg.Pool.Take(ctx, a.tenant, a.job.Profile, a.job.ID, spec)
			return takenSandbox{sb: sb, warm: warm}, err
		}
		sb, err := r.cfg.Sandboxes.Start(ctx, spec)
		return takenSandbox{sb: sb}, err
	})
	sb, warm := taken.sb, taken.warm
	if err != nil {
		if !startCutShort(ctx, err) {
			r.m.SandboxFailed.WithLabelValues(backend, "start").Inc()
		}
		return nil, claimed{}, step(errSandboxStart, err)
	}
	cl := claimed{warm: warm, at: time.Now()}
	if !warm {
		r.m.SandboxStart.WithLabelValues(backend).Observe(cl.at.Sub(start).Seconds())
	}
	a.log.InfoContext(ctx, "sandbox ready", "backend", backend, "sandbox_id", sb.Info().ID, "warm", warm, "duration_ms", cl.at.Sub(start).Milliseconds())
	return sb, cl, nil
}

// startCutShort: the start ended because the job was cancelled, the worker drains or shuts
// down (ctx), or the pool that was starting it closes (its context's error): no failure of the
// backend, which boxcar_sandbox_failures_total and the BoxcarSandboxStartFailures alert count.
// A start that outlasts the job's time does count: the backend was too slow.
func startCutShort(ctx context.Context, err error) bool {
	return errors.Is(ctx.Err(), context.Canceled) || errors.Is(err, context.Canceled)
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

func (r *Runner) progress(ctx context.Context, a *attempt, msg string) {
	if _, err := r.writeStatus(ctx, a, a.job.ID, func(s *job.Status) { s.Progress = msg }); err != nil && ctx.Err() == nil {
		a.log.WarnContext(ctx, "record progress failed", "error", err)
	}
}

// writeStatus applies change to the status id names (the attempt's job, or the id a rejected
// message is recorded under) unless it ended, fails one of conds, or a later delivery of the
// job wrote it (queue.ByAttempt). That last means the attempt lost its lease: its ack wait
// passed without a heartbeat (a GC pause, a frozen VM) and the server delivered the job again.
// The attempt is then stopped, errLeaseLost its cause, and the error says so too: whatever it
// was doing, it must leave the job to that delivery, writing and settling nothing more.
func (r *Runner) writeStatus(ctx context.Context, a *attempt, id string, change func(*job.Status), conds ...queue.StatusCond) (job.Status, error) {
	st, err := r.cfg.Queue.UpdateStatus(ctx, a.ref(id), change, append(conds, queue.ByAttempt(a.d.Attempt))...)
	if errors.Is(err, queue.ErrSuperseded) {
		err = fmt.Errorf("%w: %w", errLeaseLost, err)
		if a.cancel != nil {
			a.cancel(err)
		}
	}
	return st, err
}

// progressDelay is how long a step runs before its progress line is written: one that ends
// sooner (no inputs to copy, a few small files to upload) would be shown for an instant, at the
// cost of a status write on every job.
const progressDelay = 250 * time.Millisecond

// progressIfSlow writes msg as the job's progress if the step it names is still running after
// progressDelay. The returned done ends the step; it stops a write in flight and waits for it,
// so that it never races the attempt's next one. Stopped, not awaited: during a NATS outage the
// write waits for an answer until ctx's end, the attempt's deadline for the upload, and one
// sent as the server went away gets none even once NATS is back, which held the commit, and
// the job's end that waits for NATS and says so, until then.
func (r *Runner) progressIfSlow(ctx context.Context, a *attempt, msg string) (done func()) {
	// A timer's function, not a goroutine waiting on a timer: most steps end before
	// progressDelay, and then nothing but the timer was made for them.
	w := &slowWrite{}
	w.wg.Add(1)
	t := time.AfterFunc(progressDelay, func() {
		defer w.wg.Done()
		defer recoverAs(ctx, a.log, "progress write", a.cancel)
		if wctx := w.start(ctx); wctx != nil {
			r.progress(wctx, a, msg)
		}
	})
	return func() {
		if t.Stop() {
			w.wg.Done()
			return
		}
		w.stop()
		w.wg.Wait()
	}
}

// slowWrite is progressIfSlow's write once its timer fired: started unless the step ended
// first, and stopped (its context cancelled) when the step ends during it.
type slowWrite struct {
	wg     sync.WaitGroup // the timer's function, until it returns
	mu     sync.Mutex
	ended  bool
	cancel context.CancelFunc // the write's, while it runs
}

// start is the write's context, or nil when the step or the attempt ended first.
func (w *slowWrite) start(ctx context.Context) context.Context {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.ended || ctx.Err() != nil {
		return nil
	}
	ctx, w.cancel = context.WithCancel(ctx)
	return ctx
}

func (w *slowWrite) stop() {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.ended = true
	if w.cancel != nil {
		w.cancel()
	}
}

// statusID is the id under which a delivery's outcome is recorded: the id its subject names,
// the one id the message has (the stream keeps one message per subject). A message whose
// subject names no usable id (an uppercase one) is recorded under its stream sequence,
// job.SeqID, which the publisher's ack reported, never under the id its JSON names: that id
// may be another job's, queued with no status yet (submit writes none), whose delivery would
// then find it ended. The status's error names both ids (idMismatch).
func (a *attempt) statusID() string {
	if job.ValidID(a.d.JobID) {
		return a.d.JobID
	}
	if a.d.Seq == 0 {
		return ""
	}
	return job.SeqID(a.d.Seq)
}

// idMismatch says precisely how the job id a message's subject names (boxcar.jobs.T.J) fails
// its JSON id, and where to publish it instead.
func idMismatch(subjectID, id, want string) error {
	if subjectID == "" {
		return fmt.Errorf("%w: the message's subject names no job id; publish it on %s, the subject of the id in its JSON (submit does)", job.ErrInvalid, want)
	}
	return fmt.Errorf("%w: its subject names the job %q, its JSON the id %q; the two must be equal, byte for byte (publish it on %s)", job.ErrInvalid, subjectID, id, want)
}

// nakDelay is how long a job handed back after attempt waits before its next delivery: its
// backoff (redeliveryDelay), or the delay its fault asks for (queue.RetryAfter: a secret to
// come back, a model endpoint's Retry-After) when that is longer.
func nakDelay(base time.Duration, attempt int, err error) time.Duration {
	delay := redeliveryDelay(base, attempt)
	var retry *queue.RetryAfterError
	if errors.As(err, &retry) {
		delay = max(delay, retry.Delay)
	}
	return delay
}

// redeliveryDelay is how long a failed job waits before its next attempt (nats.retry_backoff is
// base): base, 2×base, 4×base … capped at 5 minutes. Not backoff.Delay, the wait for a part
// that is down: this one is per job and configured.
func redeliveryDelay(base time.Duration, attempt int) time.Duration {
	return min(base<<min(max(attempt-1, 0), 10), 5*time.Minute)
}
