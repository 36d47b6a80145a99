package egress

import (
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"
)

// Metrics are the boxcar_egress_* collectors, shared by every Proxy of a worker. Labels carry
// bounded values only (decision, reason, direction, mode): never a host name or a job id.
type Metrics struct {
	Decisions *prometheus.CounterVec   // decision (allowed, denied), reason
	Bytes     *prometheus.CounterVec   // direction (out, in)
	Duration  *prometheus.HistogramVec // decision
	Tunnels   *prometheus.CounterVec   // mode (splice, intercept)
}

// NewMetrics registers the collectors on reg.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	f := promauto.With(reg)
	return &Metrics{
		Decisions: f.NewCounterVec(prometheus.CounterOpts{
			Name: "boxcar_egress_decisions_total",
			Help: "Egress proxy decisions, by decision (allowed, denied) and reason.",
		}, []string{"decision", "reason"}),
		Bytes: f.NewCounterVec(prometheus.CounterOpts{
			Name: "boxcar_egress_bytes_total",
			Help: "Bytes moved through the egress proxy, by direction (out: sandbox to upstream, in: upstream to sandbox, with the proxy's own answers).",
		}, []string{"direction"}),
		Duration: f.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "boxcar_egress_request_duration_seconds",
			Help:    "Time from a request's header to the end of its response or tunnel, by decision.",
			Buckets: []float64{.001, .005, .01, .05, .1, .5, 1, 5, 30, 120, 600},
		}, []string{"decision"}),
		Tunnels: f.NewCounterVec(prometheus.CounterOpts{
			Name: "boxcar_egress_tunnels_total",
			Help: "CONNECT tunnels opened, by mode (splice: passed through; intercept: TLS terminated to inject a secret or to scrub answers).",
		}, []string{"mode"}),
	}
}

func (m *Metrics) record(d Decision) {
	if m == nil {
		return
	}
	dec := "denied"
	if d.Allowed {
		dec = "allowed"
	}
	m.Decisions.WithLabelValues(dec, string(d.Reason)).Inc()
	m.Bytes.WithLabelValues("out").Add(float64(d.BytesOut))
	m.Bytes.WithLabelValues("in").Add(float64(d.BytesIn))
	m.Duration.WithLabelValues(dec).Observe(d.Duration.Seconds())
}

func (m *Metrics) tunnel(mode string) {
	if m != nil {
		m.Tunnels.WithLabelValues(mode).Inc()
	}
}
