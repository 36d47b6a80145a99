package pool

import (
	"strings"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"
)

// Metrics are the pool's collectors.
type Metrics struct {
	Size     *prometheus.GaugeVec     // profile: warm sandboxes ready to be taken
	Hits     *prometheus.CounterVec   // profile: jobs that took a warm sandbox
	Misses   *prometheus.CounterVec   // profile: jobs of a warm profile that started one cold
	Claim    *prometheus.HistogramVec // profile, warm: from the take's first try to a sandbox in hand
	Replaced *prometheus.CounterVec   // profile, reason (removals): warm sandboxes removed unused
}

// removal is a reason of boxcar_pool_removed_total: why a warm sandbox went without serving a
// job, or a warm start came to nothing. Every path that lets one go names one (destroy).
type removal string

const (
	removedAged        removal = "aged"
	removedClaimFailed removal = "claim_failed"
	removedClaimCut    removal = "claim_cut_short"
	removedOverTarget  removal = "over_target"
	removedColdStart   removal = "cold_start"
	removedClosed      removal = "closed"
	removedStartFailed removal = "start_failed"
)

// removals are the reasons, each with what it means, in the metric's help and
// docs/operations.md.
var removals = []struct {
	reason removal
	what   string
}{
	{removedAged, "unclaimed past max_age"},
	{removedClaimFailed, "its claim failed"},
	{removedClaimCut, "the job ended during its claim"},
	{removedOverTarget, "the pool over its target (the lag fell) or its share of the slots, a start called back included"},
	{removedColdStart, "let go for a job's cold start on a full worker"},
	{removedClosed, "the pool closed (the worker stops)"},
	{removedStartFailed, "a warm start failed"},
}

var claimBuckets = []float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30}

// NewMetrics makes the pool's collectors and registers them on reg (nil: none).
func NewMetrics(reg prometheus.Registerer) *Metrics {
	f := promauto.With(reg)
	return &Metrics{
		Size: f.NewGaugeVec(prometheus.GaugeOpts{
			Name: "boxcar_pool_size", Help: "Warm sandboxes ready to be taken, by profile.",
		}, []string{"profile"}),
		Hits: f.NewCounterVec(prometheus.CounterOpts{
			Name: "boxcar_pool_hits_total", Help: "Jobs that took a warm sandbox, by profile.",
		}, []string{"profile"}),
		Misses: f.NewCounterVec(prometheus.CounterOpts{
			Name: "boxcar_pool_misses_total", Help: "Jobs of a warm profile that found no warm sandbox and started one, by profile.",
		}, []string{"profile"}),
		Claim: f.NewHistogramVec(prometheus.HistogramOpts{
			Name: "boxcar_pool_claim_seconds", Help: "Time from a job first asking for its sandbox (the tries while the backend is unavailable included) to having it, warm (true) or started for it (false).", Buckets: claimBuckets,
		}, []string{"profile", "warm"}),
		Replaced: f.NewCounterVec(prometheus.CounterOpts{
			Name: "boxcar_pool_removed_total", Help: "Warm sandboxes removed without serving a job, and warm starts that failed, by profile and reason (" + removalHelp() + ").",
		}, []string{"profile", "reason"}),
	}
}

// removalHelp is the reasons with what each means.
func removalHelp() string {
	parts := make([]string, len(removals))
	for i, r := range removals {
		parts[i] = string(r.reason) + ": " + r.what
	}
	return strings.Join(parts, "; ")
}
