package queue

import (
	"context"
	"maps"
	"slices"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// PullOne is pullOne, for the tests of the external test package: the multi-tenant pull's
// waits are too short to tell a pull that ends with its context from one that ends anyway.
func (c *Consumer) PullOne(ctx context.Context, tenant string, wait time.Duration) (jetstream.Msg, error) {
	return c.pullOne(ctx, tenant, wait)
}

// Idle reports whether a fetch waits for a notification of a new job.
func (c *Consumer) Idle() bool {
	c.ear.mu.Lock()
	defer c.ear.mu.Unlock()
	return c.ear.idlers > 0
}

// Polling reports whether the consumer gave up on notifications and polls while idle.
func (c *Consumer) Polling() bool {
	_, polling := c.ear.ear()
	return polling
}

// SetIdleCheck sets how long an idle fetch waits for a notification before it asks anyway.
func (c *Consumer) SetIdleCheck(d time.Duration) {
	c.ear.mu.Lock()
	defer c.ear.mu.Unlock()
	c.ear.check = d
}

// AckWait is the longest ack deadline of the tenants' consumers, as the server has them: how
// long a test waits to see that a job is not delivered again.
func (c *Consumer) AckWait() time.Duration {
	c.waitsMu.Lock()
	defer c.waitsMu.Unlock()
	return slices.Max(slices.Collect(maps.Values(c.ackWaits)))
}

// SweepNow has the next Fetch look for leftovers of retired tenants at once.
func (c *Consumer) SweepNow() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.swept = time.Time{}
}

// ShortQuote is shortQuote, for the test of how a misfiled approval's claims are quoted.
var ShortQuote = shortQuote

// DrainLook is how long a worker leaves a tenant's consumer on the shared stream unasked once
// it found nothing to pull there.
const DrainLook = drainLook

// SetSharedClock has u tell how long it takes the shared bucket as absent by now, not the
// wall clock: a test moves it past sharedRelook without waiting a minute.
func (u *Usage) SetSharedClock(now func() time.Time) { u.buckets.shared.stream.now = now }

// SharedRelook is how long a client takes a shared stream nobody answered for as absent.
const SharedRelook = sharedRelook

// AfterHeldRead has f run where setup, retiring a tenant, has read a job's status and how far
// its consumer delivered, before it ends the job: where a worker's claim may come between.
func (a *Admin) AfterHeldRead(f func(Ref)) { a.afterHeld = f }

// HeldUpTo is the Admin's heldUpTo on tenant's job stream, for the test that a job its consumer
// delivers while setup retires the tenant's other jobs is seen as held.
func (a *Admin) HeldUpTo(ctx context.Context, tenant string) (func(Ref) (uint64, error), error) {
	s, err := a.js.Stream(ctx, jobStream(a.cfg, tenant))
	if err != nil {
		return nil, err
	}
	return a.heldUpTo(ctx, s), nil
}

// UnlessRefused is unlessRefused, for the tests of the external test package.
func UnlessRefused(ctx context.Context, nc *nats.Conn, subjects []string, op func(context.Context) error) error {
	return unlessRefused(ctx, nc, subjects, op)
}
