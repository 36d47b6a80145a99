package queue

import (
	"context"
	"log/slog"
	"sync"

	"github.com/boxcar-run/boxcar/internal/config"
)

// tenantConcurrency holds a worker's tenants: against their consumers on the server. Each
// tenant's max_concurrent is its consumer's max_ack_pending, one value for the whole fleet:
// the server's consumer decides, as `worker setup` (or the first worker) declared it, and a
// worker never changes it (Admin.worker). A worker whose config says otherwise is
// misconfigured, which it logs when it finds it and the metrics show while it lasts.
type tenantConcurrency struct {
	cfg  config.NATS
	want map[string]int // tenant → this worker's max_concurrent
	log  *slog.Logger

	mu      sync.Mutex
	differs map[string]bool // tenant → whether it differed at the last look
}

func newTenantConcurrency(cfg config.NATS, want map[string]int, log *slog.Logger) *tenantConcurrency {
	return &tenantConcurrency{cfg: cfg, want: want, log: log, differs: map[string]bool{}}
}

// check compares tenant's max_concurrent with server, its consumer's max_ack_pending, and
// reports whether they differ. It logs when they begin to differ and when they agree again.
func (c *tenantConcurrency) check(ctx context.Context, tenant string, server int) bool {
	want := c.want[tenant]
	differs := server != want
	c.mu.Lock()
	before := c.differs[tenant]
	c.differs[tenant] = differs
	c.mu.Unlock()
	switch {
	case differs && !before:
		c.log.WarnContext(ctx, "a tenant's max_concurrent differs between this worker's tenants: and its consumer on the NATS server; "+
			"the server's applies. Every worker must have the same tenants: (and worker setup too): give every worker the same config, "+
			"then run `worker setup` with it to set the server's",
			"tenant", tenant, "consumer", consumerName(c.cfg, tenant), "server_max_concurrent", server, "config_max_concurrent", want)
	case !differs && before:
		c.log.InfoContext(ctx, "a tenant's max_concurrent on the NATS server agrees with this worker's tenants: again",
			"tenant", tenant, "max_concurrent", want)
	}
	return differs
}
