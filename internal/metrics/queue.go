package metrics

import (
	"context"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// TenantLag is one tenant's jobs its consumer has not delivered yet (Pending) and those
// delivered but not yet acknowledged (AckPending); ConfigMismatch is true while its consumer's
// max_concurrent on the server differs from the worker's tenants:.
type TenantLag struct {
	Tenant              string
	Pending, AckPending uint64
	ConfigMismatch      bool
}

// QueueLag reports the lag of each tenant's consumer; the worker adapts
// queue.Consumer.ConsumerLag to it. The tenants are the configured ones, so the label is
// bounded.
type QueueLag func(ctx context.Context) ([]TenantLag, error)

// queueLagTimeout bounds the lookup behind one scrape.
const queueLagTimeout = 2 * time.Second

// WatchQueue exports each tenant consumer's pending and ack-pending counts, and whether its
// settings on the server differ from the worker's config, looked up at each scrape.
// Every worker reports the same cluster-wide numbers: aggregate them with max, not sum. A
// failed lookup leaves the two gauges out of that scrape and counts
// boxcar_queue_info_errors_total. Lookups run on ctx (the worker's): once it ends they fail.
func (m *Metrics) WatchQueue(ctx context.Context, lag QueueLag) {
	m.registry.MustRegister(&queueCollector{
		ctx: ctx, lag: lag,
		pending: prometheus.NewDesc("boxcar_queue_pending_jobs",
			"Jobs of the tenant in the stream that its consumer has not delivered yet (cluster-wide).", []string{"tenant"}, nil),
		ackPending: prometheus.NewDesc("boxcar_queue_ack_pending_jobs",
			"Jobs of the tenant delivered to a worker and not yet acknowledged (cluster-wide).", []string{"tenant"}, nil),
		mismatch: prometheus.NewDesc("boxcar_tenant_config_mismatch",
			"1 while the tenant's consumer on the NATS server has another max_concurrent than this worker's tenants: (every worker must have the same), else 0.", []string{"tenant"}, nil),
		errors: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "boxcar_queue_info_errors_total", Help: "Failed lookups of the consumer's pending counts.",
		}),
	})
}

type queueCollector struct {
	ctx                 context.Context
	lag                 QueueLag
	pending, ackPending *prometheus.Desc
	mismatch            *prometheus.Desc
	errors              prometheus.Counter
}

func (c *queueCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.pending
	ch <- c.ackPending
	ch <- c.mismatch
	c.errors.Describe(ch)
}

func (c *queueCollector) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(c.ctx, queueLagTimeout)
	defer cancel()
	lags, err := c.lag(ctx)
	if err != nil {
		c.errors.Inc()
	}
	for _, l := range lags {
		ch <- prometheus.MustNewConstMetric(c.pending, prometheus.GaugeValue, float64(l.Pending), l.Tenant)
		ch <- prometheus.MustNewConstMetric(c.ackPending, prometheus.GaugeValue, float64(l.AckPending), l.Tenant)
		ch <- prometheus.MustNewConstMetric(c.mismatch, prometheus.GaugeValue, gauge(l.ConfigMismatch), l.Tenant)
	}
	c.errors.Collect(ch)
}

// gauge is a yes-or-no as a gauge's value.
func gauge(yes bool) float64 {
	if yes {
		return 1
	}
	return 0
}
