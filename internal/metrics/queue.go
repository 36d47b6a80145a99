package metrics

import (
	"context"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// QueueLag reports the jobs the workers' consumer has not delivered yet (pending) and those
// delivered but not yet acknowledged (ackPending). queue.Queue.ConsumerLag is one.
type QueueLag func(ctx context.Context) (pending, ackPending uint64, err error)

// queueLagTimeout bounds the lookup behind one scrape.
const queueLagTimeout = 2 * time.Second

// WatchQueue exports the consumer's pending and ack-pending counts, looked up at each scrape.
// Every worker reports the same cluster-wide numbers: aggregate them with max, not sum. A
// failed lookup leaves the two gauges out of that scrape and counts
// boxcar_queue_info_errors_total. Lookups run on ctx (the worker's): once it ends they fail.
func (m *Metrics) WatchQueue(ctx context.Context, lag QueueLag) {
	m.registry.MustRegister(&queueCollector{
		ctx: ctx, lag: lag,
		pending: prometheus.NewDesc("boxcar_queue_pending_jobs",
			"Jobs in the stream that the workers' consumer has not delivered yet (cluster-wide).", nil, nil),
		ackPending: prometheus.NewDesc("boxcar_queue_ack_pending_jobs",
			"Jobs delivered to a worker and not yet acknowledged (cluster-wide).", nil, nil),
		errors: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "boxcar_queue_info_errors_total", Help: "Failed lookups of the consumer's pending counts.",
		}),
	})
}

type queueCollector struct {
	ctx                 context.Context
	lag                 QueueLag
	pending, ackPending *prometheus.Desc
	errors              prometheus.Counter
}

func (c *queueCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.pending
	ch <- c.ackPending
	c.errors.Describe(ch)
}

func (c *queueCollector) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(c.ctx, queueLagTimeout)
	defer cancel()
	pending, ackPending, err := c.lag(ctx)
	if err != nil {
		c.errors.Inc()
	} else {
		ch <- prometheus.MustNewConstMetric(c.pending, prometheus.GaugeValue, float64(pending))
		ch <- prometheus.MustNewConstMetric(c.ackPending, prometheus.GaugeValue, float64(ackPending))
	}
	c.errors.Collect(ch)
}
