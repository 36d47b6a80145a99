// Package metrics owns Boxcar's Prometheus collectors and the HTTP endpoints /metrics, /healthz
// and /readyz. It records what others report; it makes no decisions.
//
// Names follow boxcar_<thing>_<unit> and labels carry bounded values only (profile, outcome,
// tool, backend, cap, kind, reason, stage); never a job id.
package metrics

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promauto"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// Metrics holds every collector the worker exports.
type Metrics struct {
	Jobs          *prometheus.CounterVec   // profile, outcome (the job's final state)
	JobDuration   *prometheus.HistogramVec // profile, outcome
	QueueWait     *prometheus.HistogramVec // profile
	JobsInFlight  prometheus.Gauge
	SlotsFree     prometheus.Gauge
	SandboxStart  *prometheus.HistogramVec // backend
	SandboxExec   *prometheus.HistogramVec // backend
	SandboxClose  *prometheus.HistogramVec // backend
	SandboxFailed *prometheus.CounterVec   // backend, stage (start, close)
	ToolCalls     *prometheus.CounterVec   // profile, tool, outcome (see ToolOutcome)
	// ModelRequests and ModelRequestDuration count and time every HTTP attempt to the model
	// endpoint, retries included; ModelTransport records them.
	ModelRequests        *prometheus.CounterVec   // outcome (see ModelTransport)
	ModelRequestDuration *prometheus.HistogramVec // outcome
	ModelTokens          *prometheus.CounterVec   // profile, kind (prompt, completion)
	ModelTokensEstimated *prometheus.CounterVec   // profile
	CapHits              *prometheus.CounterVec   // profile, cap
	// TenantTokens and TenantBudgetRemaining are each tenant's model tokens and what is left
	// of its daily budget today (unlimited tenants have none); label values are the configured
	// tenants only.
	TenantTokens          *prometheus.CounterVec // tenant
	TenantBudgetRemaining *prometheus.GaugeVec   // tenant
	Redeliveries          prometheus.Counter
	DeadLetters           *prometheus.CounterVec // reason
	StaleAttempts         prometheus.Counter
	UploadedBytes         prometheus.Counter
	registry              *prometheus.Registry

	// ModelUp is 1 while the model endpoint's circuit breaker lets requests pass, 0 while it
	// holds them (internal/modelgate); SetModelUp sets it.
	ModelUp prometheus.Gauge
	// ModelVerdicts counts the probes that judged one job's run of failed requests: the job's
	// own, or an outage (the breaker opened); ModelVerdict counts one.
	ModelVerdicts *prometheus.CounterVec // verdict (job, outage)
}

// Bucket layouts, in seconds.
var (
	jobBuckets   = []float64{1, 5, 15, 30, 60, 120, 300, 600, 1800, 3600}
	fastBuckets  = []float64{.01, .05, .1, .25, .5, 1, 2.5, 5, 10, 30}
	execBuckets  = []float64{.01, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 300}
	modelBuckets = []float64{.1, .25, .5, 1, 2.5, 5, 10, 20, 30, 60, 120}
)

// New registers Boxcar's collectors, plus the Go and process collectors, on a new registry.
func New() *Metrics {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	// Each collector is declared and registered in one place: promauto registers it as it is made.
	f := promauto.With(reg)
	m := &Metrics{
		Jobs: f.NewCounterVec(prometheus.CounterOpts{
			Name: "boxcar_jobs_total", Help: "Jobs that reached a final state, by profile and outcome (the state).",
		}, []string{"profile", "outcome"}),
		JobDuration: f.NewHistogramVec(prometheus.HistogramOpts{
			Name: "boxcar_job_duration_seconds", Help: "Time from a job's start on a worker to its final state.", Buckets: jobBuckets,
		}, []string{"profile", "outcome"}),
		QueueWait: f.NewHistogramVec(prometheus.HistogramOpts{
			Name: "boxcar_job_queue_wait_seconds", Help: "Time a job waited in the queue before a worker started it.", Buckets: jobBuckets,
		}, []string{"profile"}),
		JobsInFlight: f.NewGauge(prometheus.GaugeOpts{
			Name: "boxcar_jobs_in_flight", Help: "Jobs this worker is running now.",
		}),
		SlotsFree: f.NewGauge(prometheus.GaugeOpts{
			Name: "boxcar_worker_slots_free", Help: "Job slots this worker has free.",
		}),
		SandboxStart: f.NewHistogramVec(prometheus.HistogramOpts{
			Name: "boxcar_sandbox_start_seconds", Help: "Time to start a sandbox, by backend.", Buckets: fastBuckets,
		}, []string{"backend"}),
		SandboxExec: f.NewHistogramVec(prometheus.HistogramOpts{
			Name: "boxcar_sandbox_exec_seconds", Help: "Time of one command run in a sandbox, by backend.", Buckets: execBuckets,
		}, []string{"backend"}),
		SandboxClose: f.NewHistogramVec(prometheus.HistogramOpts{
			Name: "boxcar_sandbox_close_seconds", Help: "Time to remove a sandbox, by backend.", Buckets: fastBuckets,
		}, []string{"backend"}),
		SandboxFailed: f.NewCounterVec(prometheus.CounterOpts{
			Name: "boxcar_sandbox_failures_total", Help: "Sandbox operations that failed, by backend and stage.",
		}, []string{"backend", "stage"}),
		ToolCalls: f.NewCounterVec(prometheus.CounterOpts{
			Name: "boxcar_tool_calls_total", Help: "Tool calls, by profile, tool and outcome.",
		}, []string{"profile", "tool", "outcome"}),
		ModelRequests: f.NewCounterVec(prometheus.CounterOpts{
			Name: "boxcar_model_requests_total", Help: "HTTP requests to the model endpoint, retries included, by outcome.",
		}, []string{"outcome"}),
		ModelRequestDuration: f.NewHistogramVec(prometheus.HistogramOpts{
			Name: "boxcar_model_request_duration_seconds", Help: "Time of one HTTP request to the model endpoint until its body is read, by outcome.", Buckets: modelBuckets,
		}, []string{"outcome"}),
		ModelTokens: f.NewCounterVec(prometheus.CounterOpts{
			Name: "boxcar_model_tokens_total", Help: "Model tokens used, by profile and kind (prompt, completion).",
		}, []string{"profile", "kind"}),
		ModelTokensEstimated: f.NewCounterVec(prometheus.CounterOpts{
			Name: "boxcar_model_tokens_estimated_total", Help: "Model tokens of boxcar_model_tokens_total that are estimates from the bytes of answers without a usage report, by profile.",
		}, []string{"profile"}),
		ModelUp: f.NewGauge(prometheus.GaugeOpts{
			Name: "boxcar_model_up", Help: "1 while the model endpoint answers, 0 while its circuit breaker holds model requests and new jobs.",
		}),
		ModelVerdicts: f.NewCounterVec(prometheus.CounterOpts{
			Name: "boxcar_model_failure_verdicts_total", Help: "Probes that judged one job's run of failed model requests: the job's own (job) or an outage (outage).",
		}, []string{"verdict"}),
		CapHits: f.NewCounterVec(prometheus.CounterOpts{
			Name: "boxcar_cap_hits_total", Help: "Jobs ended by a cap, by profile and cap.",
		}, []string{"profile", "cap"}),
		TenantTokens: f.NewCounterVec(prometheus.CounterOpts{
			Name: "boxcar_tenant_tokens_total", Help: "Model tokens used by the jobs of each tenant.",
		}, []string{"tenant"}),
		TenantBudgetRemaining: f.NewGaugeVec(prometheus.GaugeOpts{
			Name: "boxcar_tenant_budget_remaining_tokens", Help: "Tokens left of each tenant's daily_tokens today (UTC), as this worker last saw it; absent for unlimited tenants.",
		}, []string{"tenant"}),
		Redeliveries: f.NewCounter(prometheus.CounterOpts{
			Name: "boxcar_job_redeliveries_total", Help: "Job deliveries after the first.",
		}),
		DeadLetters: f.NewCounterVec(prometheus.CounterOpts{
			Name: "boxcar_dead_letters_total", Help: "Jobs sent to the dead-letter stream, by reason.",
		}, []string{"reason"}),
		StaleAttempts: f.NewCounter(prometheus.CounterOpts{
			Name: "boxcar_stale_attempts_total", Help: "Attempts whose result was discarded because another attempt had already committed.",
		}),
		UploadedBytes: f.NewCounter(prometheus.CounterOpts{
			Name: "boxcar_store_uploaded_bytes_total", Help: "Bytes uploaded to the store.",
		}),
		registry: reg,
	}
	m.ModelUp.Set(1)
	for _, v := range []string{verdictJob, verdictOutage} {
		m.ModelVerdicts.WithLabelValues(v)
	}
	return m
}

// The values of boxcar_model_failure_verdicts_total's verdict label.
const (
	verdictJob    = "job"
	verdictOutage = "outage"
)

// ModelVerdict counts a probe's verdict on one job's failures; give it to the model gate as its
// OnVerdict.
func (m *Metrics) ModelVerdict(own bool) {
	v := verdictOutage
	if own {
		v = verdictJob
	}
	m.ModelVerdicts.WithLabelValues(v).Inc()
}

// SetModelUp sets boxcar_model_up; give it to the model gate as its OnChange.
func (m *Metrics) SetModelUp(up bool) {
	v := 0.0
	if up {
		v = 1
	}
	m.ModelUp.Set(v)
}

// Registry is where the collectors live, for tests and extra collectors.
func (m *Metrics) Registry() *prometheus.Registry { return m.registry }

// Handler serves the registry in the Prometheus exposition formats.
func (m *Metrics) Handler() http.Handler {
	return promhttp.HandlerFor(m.registry, promhttp.HandlerOpts{Registry: m.registry})
}

// Serve listens on addr and serves /metrics, /healthz and /readyz until ctx ends. It returns
// the bound address through bound (useful with port 0) before serving. /healthz answers as
// long as the process serves HTTP; /readyz answers 200 only when ready returns nil.
func (m *Metrics) Serve(ctx context.Context, addr string, ready Ready, log *slog.Logger, bound func(net.Addr)) error {
	mux := http.NewServeMux()
	mux.Handle("/metrics", m.Handler())
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, r *http.Request) { fmt.Fprintln(w, "ok") })
	mux.Handle("/readyz", readyHandler(ready, log))
	ln, err := new(net.ListenConfig).Listen(ctx, "tcp", addr)
	if err != nil {
		return fmt.Errorf("metrics: listen on %s: %w (set metrics_addr in the config, or --metrics-addr)", addr, err)
	}
	if bound != nil {
		bound(ln.Addr())
	}
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	ctx, stop := context.WithCancel(ctx)
	defer stop()
	stopped := make(chan struct{})
	go func() {
		defer close(stopped)
		<-ctx.Done()
		shutdownCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Second)
		defer cancel()
		_ = srv.Shutdown(shutdownCtx)
	}()
	err = srv.Serve(ln)
	stop()
	<-stopped
	if !errors.Is(err, http.ErrServerClosed) {
		return fmt.Errorf("metrics: serve: %w", err)
	}
	return nil
}
