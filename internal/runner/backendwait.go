package runner

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/boxcar-run/boxcar/internal/sandbox"
)

// backendHold counts the attempts waiting for the sandbox backend to take a sandbox again
// (sandbox.ErrUnavailable: the cluster's API server down or refusing the worker, its quota
// full). While any waits, the fetch loop takes no job (awaitSandboxes), as it takes none
// while the model endpoint is down (awaitModel): a job fetched now could only wait in its
// slot, and the jobs left in the queue keep their deliveries for when the backend is back.
type backendHold struct {
	mu      sync.Mutex
	waiting int
	free    chan struct{} // closed when the last waiting attempt stops waiting
}

func (h *backendHold) enter() {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.waiting == 0 {
		h.free = make(chan struct{})
	}
	h.waiting++
}

func (h *backendHold) leave() {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.waiting--
	if h.waiting == 0 {
		close(h.free)
	}
}

// held returns a channel closed once no attempt waits, or nil when none does now.
func (h *backendHold) held() <-chan struct{} {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.waiting == 0 {
		return nil
	}
	return h.free
}

// awaitSandboxes holds the fetch loop while an attempt waits for the sandbox backend.
func (r *Runner) awaitSandboxes(ctx context.Context) {
	free := r.backend.held()
	if free == nil {
		return
	}
	start := time.Now()
	r.log.WarnContext(ctx, "sandbox backend unavailable; fetching no jobs until it starts a sandbox again")
	select {
	case <-free:
		r.log.InfoContext(ctx, "sandbox backend available; fetching jobs again", "waited_ms", time.Since(start).Milliseconds())
	case <-ctx.Done():
	}
}

// takenSandbox is what a start or a pool's take gave the attempt.
type takenSandbox struct {
	sb   sandbox.Sandbox
	warm bool
}

// startWhenAvailable runs start until the backend takes a sandbox or refuses it for another
// reason than being unavailable: an outage of the backend is not the job's fault, so the
// attempt waits (awaitAnswer: its delivery kept, up to when the job must start), and so does
// the fetch loop meanwhile.
func (r *Runner) startWhenAvailable(ctx context.Context, a *attempt, start func(context.Context) (takenSandbox, error)) (takenSandbox, error) {
	held := false
	defer func() {
		if held {
			r.backend.leave()
		}
	}()
	return awaitAnswer(ctx, r, a, "the sandbox backend", func(err error) bool {
		if !errors.Is(err, sandbox.ErrUnavailable) {
			return true
		}
		if !held {
			held = true
			r.backend.enter()
		}
		return false
	}, start)
}
