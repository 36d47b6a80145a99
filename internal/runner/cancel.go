package runner

import (
	"context"
	"errors"
	"log/slog"
	"slices"
	"sync"
	"time"

	"github.com/boxcar-run/boxcar/internal/job"
	"github.com/boxcar-run/boxcar/internal/queue"
)

// cancelWatch carries out the cancels submitters ask for in the cancel bucket (a submitter
// writes no status: only workers do). Every worker watches every request of its tenants: it
// records a job that has not started as cancelled, marks a running one cancel_requested, and
// stops the attempts of the job running here. The records are compare-and-set writes, so the
// workers' answers to one request agree, and an attempt that starts after a request finds the
// job cancelled when it writes its running status.
type cancelWatch struct {
	q   Queue
	log *slog.Logger

	mu   sync.Mutex
	jobs map[queue.Ref][]*cancelHook
}

// cancelHook is one attempt's way to be cancelled; once removed it is never called, so a
// cancel cannot reach an attempt after it stopped watching.
type cancelHook struct {
	mu      sync.Mutex
	cancel  context.CancelCauseFunc
	removed bool
}

func (h *cancelHook) fire() {
	h.mu.Lock()
	defer h.mu.Unlock()
	if !h.removed {
		h.cancel(errCancelled)
	}
}

func newCancelWatch(q Queue, log *slog.Logger) *cancelWatch {
	return &cancelWatch{q: q, log: log, jobs: map[queue.Ref][]*cancelHook{}}
}

// add has cancel called with errCancelled when a cancel of the job is requested, until the
// returned remove is called. A job without a valid id cannot be asked to stop.
func (c *cancelWatch) add(r queue.Ref, cancel context.CancelCauseFunc) (remove func()) {
	if !job.ValidID(r.ID) {
		return func() {}
	}
	hook := &cancelHook{cancel: cancel}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.jobs[r] = append(c.jobs[r], hook)
	return func() {
		hook.mu.Lock()
		hook.removed = true
		hook.mu.Unlock()
		c.mu.Lock()
		defer c.mu.Unlock()
		hooks := slices.DeleteFunc(c.jobs[r], func(h *cancelHook) bool { return h == hook })
		if len(hooks) == 0 {
			delete(c.jobs, r)
		} else {
			c.jobs[r] = hooks
		}
	}
}

// apply carries out one request: the attempts running here stop, and the status says so.
func (c *cancelWatch) apply(ctx context.Context, r queue.Ref) {
	c.mu.Lock()
	hooks := slices.Clone(c.jobs[r])
	c.mu.Unlock()
	for _, h := range hooks {
		h.fire()
	}
	st, err := c.q.Status(ctx, r)
	if err == nil && st.State.Terminal() || errors.Is(err, queue.ErrUnknownJob) && !c.queued(ctx, r) {
		// Ended, or no job at all (never submitted: a request written by hand, which `submit
		// cancel` refuses; or ended and its status expired): no delivery runs it any more, so
		// its request may expire (a worker that starts reads every request, also one whose
		// release a settle missed). A request is written with no expiry, and one for an id that
		// never was would otherwise stay for ever.
		if err := c.q.ReleaseCancel(ctx, r); err != nil && ctx.Err() == nil {
			c.log.WarnContext(ctx, "cannot let the cancel request of an ended job expire; the next watch tries again", "job_id", r.ID, "tenant", r.Tenant, "error", err)
		}
		return
	}
	if err == nil && st.CancelRequested {
		return // carried out before (by this worker or another)
	}
	if err != nil && !errors.Is(err, queue.ErrUnknownJob) {
		c.log.WarnContext(ctx, "cannot read the status of a job asked to be cancelled; the next watch tries again", "job_id", r.ID, "tenant", r.Tenant, "error", err)
		return
	}
	if _, err := c.q.UpdateStatus(ctx, r, job.RequestCancel); err != nil && !errors.Is(err, queue.ErrFinal) && ctx.Err() == nil {
		c.log.WarnContext(ctx, "cannot record a cancel in the job's status; the next watch tries again", "job_id", r.ID, "tenant", r.Tenant, "error", err)
	}
}

// queued reports whether the job stream holds the job's message; when it cannot tell, that it
// does: the request is kept, and the job recorded cancelled, as before the look.
func (c *cancelWatch) queued(ctx context.Context, r queue.Ref) bool {
	queued, err := c.q.Queued(ctx, r)
	if err != nil && ctx.Err() == nil {
		c.log.WarnContext(ctx, "cannot tell whether a job asked to be cancelled is queued; keeping its request", "job_id", r.ID, "tenant", r.Tenant, "error", err)
	}
	return queued || err != nil
}

// run watches the requests until ctx ends, and closes caughtUp once it has carried out every
// request there was when it started, so that no job starts here that was cancelled before.
// A watch that breaks (the connection closed) is started again, reading every request again.
func (c *cancelWatch) run(ctx context.Context, caughtUp chan<- struct{}) {
	failing := false // logged once per outage, not at every retry
	for ctx.Err() == nil {
		refs, err := c.q.WatchCancels(ctx)
		if err != nil {
			if !failing && ctx.Err() == nil {
				failing = true
				c.log.WarnContext(ctx, "cannot watch for cancellation requests; retrying every second", "error", err)
			}
		} else {
			if failing {
				failing = false
				c.log.InfoContext(ctx, "watching for cancellation requests again")
			}
			for r := range refs {
				if r == (queue.Ref{}) {
					if caughtUp != nil {
						close(caughtUp)
						caughtUp = nil
					}
					continue
				}
				c.apply(ctx, r)
			}
		}
		select {
		case <-ctx.Done():
		case <-time.After(time.Second):
		}
	}
}

// cancelLookup bounds reading a refused job's status for a cancel (cancelAsked): NATS that
// does not answer leaves the attempt as it is.
const cancelLookup = 5 * time.Second

// cancelAsked stops the attempt, as a cancel asked now would, when the job's status says a
// cancel was asked before it: the watch recorded a job that had not started as cancelled, or a
// running one as cancel_requested. The claim's write finds that for an attempt that gets that
// far; one that admit refused reads it here, before its refusal or hand-back is decided: the
// cancel came first, and the job ends cancelled, once, not also rejected and dead-lettered, or
// handed from worker to worker under a status that says cancelled.
func (r *Runner) cancelAsked(ctx context.Context, a *attempt) {
	if !job.ValidID(a.d.JobID) {
		return // no cancel can name it
	}
	lookup, cancel := context.WithTimeout(ctx, cancelLookup)
	defer cancel()
	if st, err := r.cfg.Queue.Status(lookup, a.ref(a.d.JobID)); err == nil && cancelRequested(st) {
		a.cancel(errCancelled)
	}
}

// cancelRequested: the status records a cancel of the job, carried out or asked.
func cancelRequested(st job.Status) bool {
	return st.State == job.StateCancelled || st.CancelRequested
}
