package runner

import (
	"context"
	"slices"
	"sync"
	"time"
)

// fetchHold is a dependency whose outage holds the fetch loop: while any attempt waits for it
// (awaitUntil), the loop takes no job (awaitHolds), as it takes none while the model endpoint
// is down (awaitModel). A job fetched then could only wait in its slot, held by heartbeats,
// while a worker the dependency answers could run it; the jobs left in the queue keep their
// deliveries for when it is back. A dependency not in fetchHolds (NATS: the fetch itself waits
// for it) holds nothing. A new one is a row.
type fetchHold struct {
	what string // the dependency as awaitUntil names it
	// shared, when set, tells whether the attempt's wait is for the dependency every job
	// shares: a wait for one tenant's own one holds no other tenant's jobs back.
	shared func(*attempt) bool
	// down and up are the loop's log lines when it begins and ends holding for it.
	down, up string
}

var fetchHolds = [...]fetchHold{
	// sandbox.ErrUnavailable: the cluster's API server down or refusing the worker, its quota
	// full (startWhenAvailable).
	{what: "the sandbox backend", down: "sandbox backend unavailable; fetching no jobs until it starts a sandbox again",
		up: "sandbox backend available; fetching jobs again"},
	// An outage, or the store refusing the worker itself (store.ErrWorkerRefused: its
	// credentials, its clock), met by any attempt's wait for it, before or after its run; not
	// a wait for a tenant's own bucket (tenants.T.bucket).
	{what: "the store", shared: func(a *attempt) bool { return !a.ownBucket },
		down: "store unavailable; fetching no jobs until it answers", up: "store answers; fetching jobs again"},
}

// waiters counts the attempts waiting for one dependency of fetchHolds.
type waiters struct {
	mu      sync.Mutex
	waiting int
	free    chan struct{} // closed when the last waiting attempt stops waiting
}

func (h *waiters) enter() {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.waiting == 0 {
		h.free = make(chan struct{})
	}
	h.waiting++
}

func (h *waiters) leave() {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.waiting--
	if h.waiting == 0 {
		close(h.free)
	}
}

// held returns a channel closed once no attempt waits, or nil when none does now.
func (h *waiters) held() <-chan struct{} {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.waiting == 0 {
		return nil
	}
	return h.free
}

// waitersOf is what counts the attempts waiting for what (fetchHolds), or nil when a's wait
// for it holds no fetch.
func (r *Runner) waitersOf(a *attempt, what string) *waiters {
	i := slices.IndexFunc(fetchHolds[:], func(h fetchHold) bool { return h.what == what })
	if i < 0 || fetchHolds[i].shared != nil && !fetchHolds[i].shared(a) {
		return nil
	}
	return &r.waiters[i]
}

// awaitHolds holds the fetch loop while an attempt waits for a dependency of fetchHolds.
func (r *Runner) awaitHolds(ctx context.Context) {
	for i, h := range fetchHolds {
		free := r.waiters[i].held()
		if free == nil {
			continue
		}
		start := time.Now()
		r.log.WarnContext(ctx, h.down)
		select {
		case <-free:
			r.log.InfoContext(ctx, h.up, "waited_ms", time.Since(start).Milliseconds())
		case <-ctx.Done():
			return
		}
	}
}
