package runner

import (
	"context"
	"log/slog"
	"slices"
	"sync"
	"time"

	"github.com/boxcar-run/boxcar/internal/job"
	"github.com/boxcar-run/boxcar/internal/queue"
)

// cancelLinger is how long the watch outlives the last job running here, so that a worker
// taking one job after another keeps one consumer on the server instead of making a new one.
const cancelLinger = time.Minute

// cancelWatch tells the jobs running here when someone asks for one to be cancelled. One watch
// on the status bucket serves all of them, fanned out by job id: a watch per job made and
// removed a consumer on the server for every job (0.5-0.75 ms of each).
//
// Nothing is missed between a job's start and the watch: a job registers before it writes its
// running status, and that write (a compare-and-set on the current value) tells it of a cancel
// requested before; a cancel requested after it comes through the watch, which either runs
// already or, when it starts (again), reads the status of every registered job once.
type cancelWatch struct {
	q   Queue
	log *slog.Logger

	mu   sync.Mutex
	jobs map[string][]*cancelHook
	cur  *watchRun // nil when no watch runs
	used time.Time // when the last job was added or removed
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

// watchRun is one run of the watch goroutine.
type watchRun struct {
	stop context.CancelFunc
	done chan struct{}
}

func newCancelWatch(q Queue, log *slog.Logger) *cancelWatch {
	return &cancelWatch{q: q, log: log, jobs: map[string][]*cancelHook{}}
}

// add has cancel called with errCancelled when a cancel of the job is requested, until the
// returned remove is called. A job without a valid id has no status to watch.
func (c *cancelWatch) add(id string, cancel context.CancelCauseFunc) (remove func()) {
	if !job.ValidID(id) {
		return func() {}
	}
	hook := &cancelHook{cancel: cancel}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.jobs[id] = append(c.jobs[id], hook)
	c.used = time.Now()
	if c.cur == nil {
		ctx, stop := context.WithCancel(context.Background())
		run := &watchRun{stop: stop, done: make(chan struct{})}
		c.cur = run
		go c.run(ctx, run)
	}
	return func() {
		hook.mu.Lock()
		hook.removed = true
		hook.mu.Unlock()
		c.mu.Lock()
		defer c.mu.Unlock()
		c.used = time.Now()
		hooks := slices.DeleteFunc(c.jobs[id], func(h *cancelHook) bool { return h == hook })
		if len(hooks) == 0 {
			delete(c.jobs, id)
		} else {
			c.jobs[id] = hooks
		}
	}
}

// close stops the watch and waits for it; a later add starts it again.
func (c *cancelWatch) close() {
	c.mu.Lock()
	run := c.cur
	c.cur = nil
	c.mu.Unlock()
	if run != nil {
		run.stop()
		<-run.done
	}
}

func (c *cancelWatch) watching(id string) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.jobs[id]) > 0
}

// fire cancels the jobs running here that st asks to stop.
func (c *cancelWatch) fire(st job.Status) {
	if !st.CancelRequested && st.State != job.StateCancelled {
		return
	}
	c.mu.Lock()
	hooks := slices.Clone(c.jobs[st.ID])
	c.mu.Unlock()
	for _, h := range hooks {
		h.fire()
	}
}

// ended reports whether run is to end: it was closed, or no job has been here for cancelLinger.
func (c *cancelWatch) ended(run *watchRun) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.cur != run {
		return true
	}
	if len(c.jobs) > 0 || time.Since(c.used) < cancelLinger {
		return false
	}
	c.cur = nil
	return true
}

func (c *cancelWatch) run(ctx context.Context, run *watchRun) {
	defer close(run.done)
	defer run.stop()
	failing := false // logged once per outage, not at every retry
	linger := time.NewTicker(cancelLinger / 4)
	defer linger.Stop()
	for ctx.Err() == nil && !c.ended(run) {
		updates, err := c.q.WatchChanges(ctx, func(r queue.Ref) bool { return c.watching(r.ID) })
		if err != nil {
			if !failing && ctx.Err() == nil {
				failing = true
				c.log.WarnContext(ctx, "cannot watch for cancellation requests; retrying every second", "error", err)
			}
			select {
			case <-ctx.Done():
			case <-time.After(time.Second):
			}
			continue
		}
		if failing {
			failing = false
			c.log.InfoContext(ctx, "watching for cancellation requests again")
		}
		c.catchUp(ctx)
		for open := true; open; {
			select {
			case st, ok := <-updates:
				if !ok {
					open = false
					continue
				}
				c.fire(st)
			case <-linger.C:
				if c.ended(run) {
					return
				}
			}
		}
		// The watch broke (the connection closed, typically): watch again in a moment.
		select {
		case <-ctx.Done():
		case <-time.After(time.Second):
		}
	}
}

// catchUp reads the status of every job registered when the watch (re)started: a cancel
// requested while no watch ran is in it.
func (c *cancelWatch) catchUp(ctx context.Context) {
	c.mu.Lock()
	ids := make([]string, 0, len(c.jobs))
	for id := range c.jobs {
		ids = append(ids, id)
	}
	c.mu.Unlock()
	for _, id := range ids {
		if st, err := c.q.Status(ctx, queue.Ref{ID: id}); err == nil {
			c.fire(st)
		}
	}
}
