package workercmd

import (
	"github.com/boxcar-run/boxcar/internal/egress"
	"github.com/boxcar-run/boxcar/internal/metrics"
	"github.com/boxcar-run/boxcar/internal/pool"
)

// Collectors are every collector a worker exports, all on Worker's registry: its own, the warm
// pool's and the egress proxies'. The worker makes them with NewCollectors and so do the tests
// that hold the Grafana dashboard and docs/operations.md to what it exports, so a collector
// added here is one they check.
type Collectors struct {
	Worker *metrics.Metrics
	Pool   *pool.Metrics
	Egress *egress.Metrics
}

// NewCollectors makes a worker's collectors on one registry.
func NewCollectors() Collectors {
	m := metrics.New()
	return Collectors{Worker: m, Pool: pool.NewMetrics(m.Registry()), Egress: egress.NewMetrics(m.Registry())}
}
