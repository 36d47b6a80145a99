package queue

import (
	"context"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// PullOne is pullOne, for the tests of the external test package: the multi-tenant pull's
// waits are too short to tell a pull that ends with its context from one that ends anyway.
func (c *Consumer) PullOne(ctx context.Context, tenant string, wait time.Duration) (jetstream.Msg, error) {
	return c.pullOne(ctx, tenant, wait)
}
