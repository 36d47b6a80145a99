package runner

import (
	"context"
	"errors"
	"fmt"
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
//
// Each tenant's requests are applied in order on a watch of the tenant's own, the tenants'
// watches side by side: a tenant that writes requests by the thousand (each one a few calls
// to NATS to apply) delays only its own, never another tenant's. And one more watch, of every
// tenant's requests, stops the attempts running here as it reads their requests, calling NATS
// for nothing (stops): a job's own tenant's backlog does not delay its stop either; its status
// says cancel_requested once its tenant's watch gets to its request, or cancelled at its end.
type cancelWatch struct {
	q   Queue
	log *slog.Logger
	// approvals expires the requests a job cancelled while queued left pending (nil: none).
	approvals Approvals

	mu   sync.Mutex
	jobs map[queue.Ref][]*cancelHook
	// tenants are the watched tenants' watches, by tenant: whether each is behind (before).
	tenants map[string]*tenantWatch
}

// tenantWatch says whether a tenant's watch may have requests it has not applied: from its
// start (and every restart) until it has read every request there was, and while it works
// through requests the server still had for it. Attempts of the tenant look up their own
// request meanwhile (before).
type tenantWatch struct {
	mu     sync.Mutex
	behind bool
	ready  chan struct{} // closed when the watch is no longer behind
}

func newTenantWatch() *tenantWatch { return &tenantWatch{behind: true, ready: make(chan struct{})} }

func (t *tenantWatch) set(behind bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	switch {
	case behind == t.behind:
	case behind:
		t.ready = make(chan struct{})
	default:
		close(t.ready)
	}
	t.behind = behind
}

// state is whether the watch is behind, and a channel closed once it no longer is.
func (t *tenantWatch) state() (behind bool, ready <-chan struct{}) {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.behind, t.ready
}

// cancelHook is one attempt's way to be cancelled; once removed it is never called, so a
// cancel cannot reach an attempt after it stopped watching.
type cancelHook struct {
	mu      sync.Mutex
	cancel  context.CancelCauseFunc
	removed bool
}

func (h *cancelHook) fire(cause error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if !h.removed {
		h.cancel(cause)
	}
}

func newCancelWatch(q Queue, log *slog.Logger) *cancelWatch {
	return &cancelWatch{q: q, log: log, jobs: map[queue.Ref][]*cancelHook{}, tenants: map[string]*tenantWatch{}}
}

// add has cancel called with errCancelled (or a panic's cause: handle) when a cancel of the job is requested, until the
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

// stop stops the attempts of the job running here.
func (c *cancelWatch) stop(r queue.Ref) { c.stopWith(r, errCancelled) }

// stopWith stops the attempts of the job running here with cause.
func (c *cancelWatch) stopWith(r queue.Ref, cause error) {
	c.mu.Lock()
	hooks := slices.Clone(c.jobs[r])
	c.mu.Unlock()
	for _, h := range hooks {
		h.fire(cause)
	}
}

// apply carries out one request: the attempts running here stop, and the status says so. An
// error says NATS failed it, and it is not carried out, or not all of it: the caller tries
// again (errNotLooked: all but deciding whether the request may expire).
func (c *cancelWatch) apply(ctx context.Context, r queue.Ref) error {
	c.stop(r)
	st, err := c.q.Status(ctx, r)
	if err != nil && !errors.Is(err, queue.ErrUnknownJob) {
		return fmt.Errorf("read the status of a job asked to be cancelled: %w", err)
	}
	var notLooked error
	if err != nil || st.State.Terminal() {
		// Ended, or no job at all (never submitted: a request written by hand, which `submit
		// cancel` refuses; or ended and its status expired), and no message of it left in the
		// job stream: no delivery runs it any more, so its request may expire (a worker that
		// starts reads every request, also one whose release a settle missed). A request is
		// written with no expiry, and one for an id that never was would otherwise stay for
		// ever. A job recorded cancelled while queued has a terminal status and its message
		// still queued: its request stays until the delivery that takes it commits its end, as
		// its status expires before that when the queue is long (another worker's watch, or a
		// restarted one, let it expire and the job ran). When NATS cannot say, the request is
		// kept, as for a queued job, and looked at again: kept and not looked at again, it
		// stayed in the bucket until some worker's watch started again.
		queued, lookErr := c.q.Queued(ctx, r)
		switch {
		case lookErr != nil:
			notLooked = fmt.Errorf("%w: %w", errNotLooked, lookErr)
		case !queued:
			if err := c.q.ReleaseCancel(ctx, r); err != nil {
				return fmt.Errorf("let the cancel request of an ended job expire: %w", err)
			}
			return nil
		}
	}
	if err == nil && (st.CancelRequested || st.State.Terminal()) {
		return notLooked // carried out before (by this worker or another), or queued and recorded cancelled
	}
	// A job cancelled while queued may have been handed back waiting for an approval: its
	// request, left pending for the next delivery, ends with it (leaveAsked), as at any end.
	var left []string
	now := time.Now()
	_, err = c.q.UpdateStatus(ctx, r, func(s *job.Status) {
		job.RequestCancel(s)
		left = nil
		if s.State.Terminal() {
			left = leaveAsked(s, now)
		}
	})
	switch {
	case err == nil:
		expireLeft(ctx, c.approvals, r, left, job.StateCancelled, c.log)
	case !errors.Is(err, queue.ErrFinal):
		return fmt.Errorf("record a cancel in the job's status: %w", err)
	}
	// Again after the write: an attempt that began after the first stop adds its hook before
	// its claim, and a claim that came before this write is stopped only here (a later one
	// reads the request in the status).
	c.stop(r)
	return notLooked
}

// errNotLooked: apply carried out the request, but NATS did not say whether the job's message
// is in the job stream, so the request is kept until a look says it may expire.
var errNotLooked = errors.New("cannot tell whether a job asked to be cancelled is queued; keeping its request")

// applyRetries bound the wait between a watch's tries of a request NATS failed.
const (
	applyRetryFirst = time.Second
	applyRetryMost  = 30 * time.Second
)

// applyUntilDone applies the request until NATS carries it out or ctx ends, waiting longer
// after each failure: a request a failure dropped stayed undone until the watch started again,
// which only a broken connection makes it do (NATS answering late under load left most of a
// tenant's backlog undone, its watch saying it was up to date).
func (c *cancelWatch) applyUntilDone(ctx context.Context, r queue.Ref) {
	wait := applyRetryFirst
	for tries := 1; ; tries++ {
		err := c.apply(ctx, r)
		switch {
		case ctx.Err() != nil:
			return
		case err == nil && tries > 1:
			c.log.InfoContext(ctx, "carried out the cancel request", "job_id", r.ID, "tenant", r.Tenant, "tries", tries)
			return
		case err == nil:
			return
		case tries == 1:
			c.log.WarnContext(ctx, "cannot carry out a cancel request; trying again", "job_id", r.ID, "tenant", r.Tenant, "error", err)
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(wait):
		}
		wait = min(2*wait, applyRetryMost)
	}
}

// start watches the requests of each of the worker's tenants until ctx ends, and returns a
// channel closed once every watch has stopped. The tenants are marked watched, and behind,
// before it returns, so that attempts that begin from then on look up their own request until
// their tenant's watch has caught up (before).
func (c *cancelWatch) start(ctx context.Context) (stopped <-chan struct{}) {
	tenants := c.q.Tenants()
	watches := make(map[string]*tenantWatch, len(tenants))
	for _, t := range tenants {
		watches[t] = newTenantWatch()
	}
	c.mu.Lock()
	c.tenants = watches
	c.mu.Unlock()
	var wg sync.WaitGroup
	for t, tw := range watches {
		wg.Go(func() { c.watch(ctx, t, tw) })
	}
	wg.Go(func() { c.stops(ctx) })
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	return done
}

// watch applies the tenant's requests in order until ctx ends, and keeps tw saying whether it
// is behind.
func (c *cancelWatch) watch(ctx context.Context, tenant string, tw *tenantWatch) {
	c.follow(ctx, tenant, func(ctx context.Context) (<-chan queue.CancelUpdate, error) {
		tw.set(true)
		return c.q.WatchCancels(ctx, tenant)
	}, func(u queue.CancelUpdate) {
		if u.Ref != (queue.Ref{}) {
			tw.set(true) // this one is not applied yet
			c.applyUntilDone(ctx, u.Ref)
		}
		tw.set(u.Behind)
	})
}

// stops stops the attempts running here as it reads their jobs' requests, every tenant's on
// one watch, until ctx ends. It calls NATS for nothing, so it reads requests as fast as they
// come, however far behind a tenant's watch is: a request of a job that runs here stops it at
// once, never after its tenant's backlog. A request of a job that starts after it was read is
// the tenant's watch's, or the attempt's own look-up (before).
func (c *cancelWatch) stops(ctx context.Context) {
	c.follow(ctx, "", c.q.WatchAllCancels, func(u queue.CancelUpdate) {
		if u.Ref != (queue.Ref{}) {
			c.stop(u.Ref)
		}
	})
}

// follow hands each update of the watch that open starts to each, until ctx ends. A watch that
// breaks (the connection closed) is started again every second, reading every request again.
// tenant names the watch in the log ("" for every tenant's).
func (c *cancelWatch) follow(ctx context.Context, tenant string, open func(context.Context) (<-chan queue.CancelUpdate, error), each func(queue.CancelUpdate)) {
	failing := false // logged once per outage, not at every retry
	for ctx.Err() == nil {
		updates, err := open(ctx)
		if err != nil {
			if !failing && ctx.Err() == nil {
				failing = true
				c.log.WarnContext(ctx, "cannot watch for cancellation requests; retrying every second", "tenant", tenant, "error", err)
			}
		} else {
			if failing {
				failing = false
				c.log.InfoContext(ctx, "watching for cancellation requests again", "tenant", tenant)
			}
			for u := range updates {
				c.handle(ctx, u, each)
			}
		}
		select {
		case <-ctx.Done():
		case <-time.After(time.Second):
		}
	}
}

// handle hands u to each. A panic in it ends the attempts of u's job running here as the
// worker's panic (recoverAs), and the watch goes on with the next request: it is the
// worker's, and every job's cancel goes through it.
func (c *cancelWatch) handle(ctx context.Context, u queue.CancelUpdate, each func(queue.CancelUpdate)) {
	defer recoverAs(ctx, c.log.With("job_id", u.Ref.ID, "tenant", u.Ref.Tenant), "cancel watch", func(err error) { c.stopWith(u.Ref, err) })
	each(u)
}

// before applies the cancel request of the job, if there is one, while its tenant's watch is
// behind (working through a backlog of requests, however many, or not watching): an attempt's
// claim (and admit's refusals, and an exhausted delivery's end) read the job's status for a
// cancel asked before it, and a request written while the job was queued must be in it by
// then. A watch that is not behind has applied every such request itself, but one written as
// the job was fetched (which races the start, as on any worker). So a worker that starts
// fetches at once, and runs no job cancelled while queued, instead of fetching nothing until
// it has applied every request in the bucket. When NATS cannot say whether there is a request,
// or fails to carry it out, the attempt waits for the watch to catch up, as every attempt did
// before.
func (c *cancelWatch) before(ctx context.Context, r queue.Ref) {
	c.mu.Lock()
	tw, watched := c.tenants[r.Tenant]
	c.mu.Unlock()
	if !watched || !job.ValidID(r.ID) {
		return // not a tenant of this worker's (admit refuses it), or no cancel can name it
	}
	if behind, _ := tw.state(); !behind {
		return
	}
	asked, err := c.q.CancelAsked(ctx, r)
	if err == nil && asked {
		err = c.apply(ctx, r)
	}
	if err == nil || errors.Is(err, errNotLooked) {
		return // carried out; the request's expiry is the watch's, or the settle's, to decide
	}
	c.log.WarnContext(ctx, "cannot tell whether a cancel of the job was asked, or carry it out; waiting for the cancel watch", "job_id", r.ID, "tenant", r.Tenant, "error", err)
	for behind, ready := tw.state(); behind && ctx.Err() == nil; behind, ready = tw.state() {
		select {
		case <-ready:
		case <-ctx.Done():
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
