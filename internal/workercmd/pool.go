package workercmd

import (
	"github.com/boxcar-run/boxcar/internal/pool"
	"github.com/boxcar-run/boxcar/internal/queue"
)

// newPool is the worker's warm pool when a profile keeps warm sandboxes, sized by its tenants'
// lags; nil when none does.
func newPool(p *parts, q *queue.Consumer) (*pool.Pool, error) {
	warm := false
	for _, prof := range p.cfg.Profiles {
		warm = warm || prof.Warm != nil
	}
	if !warm {
		return nil, nil
	}
	return pool.New(pool.Config{
		Provider: p.sandboxes,
		Profiles: p.cfg.Profiles,
		Slots:    p.cfg.Concurrency,
		Lag:      pool.QueueLag(q.ConsumerLag),
		Tenants:  p.cfg.TenantsOrDefault(),
		Metrics:  pool.NewMetrics(p.metrics.Registry()),
		Logger:   p.log,
	})
}
