package runner

import (
	"context"
	"time"

	"github.com/boxcar-run/boxcar/internal/queue"
)

// HeartbeatWith has the runner c configures beat each delivery with beat (a test's panic in
// the heartbeats' goroutine).
func HeartbeatWith(c *Config, beat func(d *queue.Delivery, ctx context.Context, interval time.Duration)) {
	c.heartbeat = beat
}
