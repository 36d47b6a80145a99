package sandbox

import (
	"context"
	"sync"
)

// calls tracks the calls in flight on one sandbox so that Close can refuse new ones, stop the
// running ones and wait for them: the same bookkeeping on every backend.
type calls struct {
	mu      sync.Mutex
	closed  error // why the sandbox no longer takes calls; wraps ErrClosed
	running map[uint64]context.CancelCauseFunc
	nextID  uint64
	busy    int           // calls in flight
	idle    chan struct{} // closed once shut down and no call is in flight
}

func newCalls() *calls {
	return &calls{running: map[uint64]context.CancelCauseFunc{}, idle: make(chan struct{})}
}

// begin registers a call; cancel, when given, is how shutdown stops it.
func (c *calls) begin(cancel context.CancelCauseFunc) (uint64, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed != nil {
		return 0, c.closed
	}
	c.nextID++
	c.busy++
	if cancel != nil {
		c.running[c.nextID] = cancel
	}
	return c.nextID, nil
}

func (c *calls) end(id uint64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.running, id)
	c.busy--
	if c.closed != nil && c.busy == 0 {
		close(c.idle)
	}
}

// shutdown refuses new calls and cancels running ones; the first reason stays.
func (c *calls) shutdown(reason error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed != nil {
		return
	}
	c.closed = reason
	for _, cancel := range c.running {
		cancel(reason)
	}
	if c.busy == 0 {
		close(c.idle)
	}
}
