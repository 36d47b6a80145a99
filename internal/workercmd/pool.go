package workercmd

import (
	"github.com/boxcar-run/boxcar/internal/pool"
)

// newPool is the worker's warm pool when a profile keeps warm sandboxes, sized by its tenants'
// lags (pool.QueueLag over the worker's consumer); nil when none does.
func newPool(p *parts, lag pool.LagSource) (*pool.Pool, error) {
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
		Lag:      lag,
		Tenants:  p.cfg.TenantsOrDefault(),
		Metrics:  p.poolM,
		Logger:   p.log,
	})
}
