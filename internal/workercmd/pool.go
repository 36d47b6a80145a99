package workercmd

import (
	"github.com/boxcar-run/boxcar/internal/pool"
	"github.com/boxcar-run/boxcar/internal/queue"
)

// newPool is the worker's warm pool when a profile keeps warm sandboxes, sized by the
// consumer's lag; nil when none does.
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
		Lag:      pool.ConsumerLag(q.TotalLag),
		Metrics:  pool.NewMetrics(p.metrics.Registry()),
		Logger:   p.log,
	})
}
