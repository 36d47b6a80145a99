package metrics_test

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	dto "github.com/prometheus/client_model/go"
	"go.uber.org/goleak"

	"github.com/boxcar-run/boxcar/internal/metrics"
	"github.com/boxcar-run/boxcar/internal/spawn"
	"github.com/boxcar-run/boxcar/internal/testnet"
	"github.com/boxcar-run/boxcar/test/harness"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, goleak.IgnoreAnyFunction(spawn.StarterFunc))
}

// sampleCount is how many observations a histogram series holds.
func sampleCount(t *testing.T, h prometheus.Observer) uint64 {
	t.Helper()
	var pb dto.Metric
	if err := h.(prometheus.Metric).Write(&pb); err != nil {
		t.Fatal(err)
	}
	return pb.GetHistogram().GetSampleCount()
}

func TestModelTransport(t *testing.T) {
	release := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/ok":
			_, _ = w.Write([]byte(`{"id":"x"}`))
		case "/slow-body":
			w.WriteHeader(http.StatusOK)
			w.(http.Flusher).Flush()
			<-release
			_, _ = w.Write([]byte("done"))
		case "/hang":
			// The server notices a client going away only once the body is read.
			_, _ = io.Copy(io.Discard, r.Body)
			<-r.Context().Done()
		case "/429":
			http.Error(w, "slow down", http.StatusTooManyRequests)
		case "/401":
			http.Error(w, "no key", http.StatusUnauthorized)
		case "/503":
			http.Error(w, "busy", http.StatusServiceUnavailable)
		case "/stalled-body":
			_, _ = w.Write([]byte(`{"id":`))
			w.(http.Flusher).Flush()
			<-r.Context().Done()
		case "/cut-body":
			conn, buf, err := w.(http.Hijacker).Hijack()
			if err != nil {
				t.Error(err)
				return
			}
			_, _ = buf.WriteString("HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n{\"id\":")
			_ = buf.Flush()
			conn.Close()
		case "/long-body":
			_, _ = w.Write(make([]byte, 1<<20))
		}
	}))
	t.Cleanup(srv.Close)
	t.Cleanup(func() {
		select {
		case <-release:
		default:
			close(release)
		}
	})
	refused := "http://" + testnet.ClosedAddr(t)

	tests := []struct {
		name    string
		url     string
		timeout time.Duration
		// stopAfter is how many bytes of the body are read before it is closed; 0: all.
		stopAfter int64
		want      string
	}{
		{name: "success", url: srv.URL + "/ok", want: metrics.ModelOK},
		{name: "rate limited", url: srv.URL + "/429", want: metrics.ModelRateLimited},
		{name: "rejected key", url: srv.URL + "/401", want: metrics.ModelClientError},
		{name: "server busy", url: srv.URL + "/503", want: metrics.ModelServerError},
		{name: "no answer in time", url: srv.URL + "/hang", timeout: 100 * time.Millisecond, want: metrics.ModelTimeout},
		{name: "connection refused", url: refused, want: metrics.ModelError},
		// An answer's outcome is decided when its body ends: the agent got no answer from a 200
		// whose body stalled past the deadline or broke off, and the client retries it.
		{name: "a 200 whose body stalls past the deadline", url: srv.URL + "/stalled-body", timeout: 300 * time.Millisecond, want: metrics.ModelTimeout},
		{name: "a 200 whose body breaks off", url: srv.URL + "/cut-body", want: metrics.ModelError},
		{name: "a 200 whose reader stops reading (the agent's size cap)", url: srv.URL + "/long-body", stopAfter: 10, want: metrics.ModelOK},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m := metrics.New()
			client := &http.Client{Transport: m.ModelTransport(nil)}
			ctx := context.Background()
			if tt.timeout > 0 {
				var cancel context.CancelFunc
				ctx, cancel = context.WithTimeout(ctx, tt.timeout)
				defer cancel()
			}
			req, err := http.NewRequestWithContext(ctx, http.MethodPost, tt.url, strings.NewReader("{}"))
			if err != nil {
				t.Fatal(err)
			}
			if resp, err := client.Do(req); err == nil {
				body := io.Reader(resp.Body)
				if tt.stopAfter > 0 {
					body = io.LimitReader(body, tt.stopAfter)
				}
				_, _ = io.Copy(io.Discard, body)
				resp.Body.Close()
			}
			if got := testutil.ToFloat64(m.ModelRequests.WithLabelValues(tt.want)); got != 1 {
				t.Errorf("boxcar_model_requests_total{outcome=%q} = %v, want 1", tt.want, got)
			}
			if n := testutil.CollectAndCount(m.ModelRequests); n != 1 {
				t.Errorf("%d outcome series, want only %q", n, tt.want)
			}
			if n := sampleCount(t, m.ModelRequestDuration.WithLabelValues(tt.want)); n != 1 {
				t.Errorf("duration observations = %d, want 1", n)
			}
		})
	}

	t.Run("timed until the body is read", func(t *testing.T) {
		m := metrics.New()
		client := &http.Client{Transport: m.ModelTransport(nil)}
		resp, err := client.Get(srv.URL + "/slow-body")
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		if n := sampleCount(t, m.ModelRequestDuration.WithLabelValues(metrics.ModelOK)); n != 0 {
			t.Fatalf("observed %d before the body was read, want 0", n)
		}
		close(release)
		if _, err := io.ReadAll(resp.Body); err != nil {
			t.Fatal(err)
		}
		resp.Body.Close() // a second observation must not follow
		if n := sampleCount(t, m.ModelRequestDuration.WithLabelValues(metrics.ModelOK)); n != 1 {
			t.Errorf("observed %d after the body was read, want 1", n)
		}
	})
}

func TestWatchQueue(t *testing.T) {
	m := metrics.New()
	var fail error
	m.WatchQueue(context.Background(), func(ctx context.Context) ([]metrics.TenantLag, error) {
		if fail != nil {
			return nil, fail
		}
		return []metrics.TenantLag{{Tenant: "team-a", Pending: 7, AckPending: 2}, {Tenant: "team-b", Pending: 0, AckPending: 1, ConfigMismatch: true}}, nil
	})
	names := []string{"boxcar_queue_pending_jobs", "boxcar_queue_ack_pending_jobs", "boxcar_queue_info_errors_total", "boxcar_tenant_config_mismatch"}
	err := testutil.GatherAndCompare(m.Registry(), strings.NewReader(`
# HELP boxcar_queue_ack_pending_jobs Jobs of the tenant delivered to a worker and not yet acknowledged (cluster-wide).
# TYPE boxcar_queue_ack_pending_jobs gauge
boxcar_queue_ack_pending_jobs{tenant="team-a"} 2
boxcar_queue_ack_pending_jobs{tenant="team-b"} 1
# HELP boxcar_queue_info_errors_total Failed lookups of the consumer's pending counts.
# TYPE boxcar_queue_info_errors_total counter
boxcar_queue_info_errors_total 0
# HELP boxcar_queue_pending_jobs Jobs of the tenant in the stream that its consumer has not delivered yet (cluster-wide).
# TYPE boxcar_queue_pending_jobs gauge
boxcar_queue_pending_jobs{tenant="team-a"} 7
boxcar_queue_pending_jobs{tenant="team-b"} 0
# HELP boxcar_tenant_config_mismatch 1 while the tenant's consumer on the NATS server has another max_concurrent than this worker's tenants: (every worker must have the same), else 0.
# TYPE boxcar_tenant_config_mismatch gauge
boxcar_tenant_config_mismatch{tenant="team-a"} 0
boxcar_tenant_config_mismatch{tenant="team-b"} 1
`), names...)
	if err != nil {
		t.Error(err)
	}

	fail = errors.New("no responders")
	err = testutil.GatherAndCompare(m.Registry(), strings.NewReader(`
# HELP boxcar_queue_info_errors_total Failed lookups of the consumer's pending counts.
# TYPE boxcar_queue_info_errors_total counter
boxcar_queue_info_errors_total 1
`), names...)
	if err != nil {
		t.Errorf("after a failed lookup: %v", err)
	}
}

func TestToolOutcome(t *testing.T) {
	tests := []struct {
		name     string
		exitCode int
		timedOut bool
		err      string
		want     string
	}{
		{name: "success", want: metrics.ToolOK},
		{name: "non-zero exit", exitCode: 3, want: metrics.ToolNonzeroExit},
		{name: "timed out", exitCode: 137, timedOut: true, want: metrics.ToolTimedOut},
		{name: "did not run", exitCode: -1, err: "invalid arguments", want: metrics.ToolError},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := metrics.ToolOutcome(tt.exitCode, tt.timedOut, tt.err); got != tt.want {
				t.Errorf("ToolOutcome = %q, want %q", got, tt.want)
			}
		})
	}
}

// TestNamesLint fills one series of every collector and runs the same lint as `promtool check
// metrics`; the e2e tests run promtool itself on a real scrape.
func TestNamesLint(t *testing.T) {
	m := metrics.New()
	m.WatchQueue(context.Background(), func(context.Context) ([]metrics.TenantLag, error) {
		return []metrics.TenantLag{{Tenant: "default"}}, nil
	})
	m.Jobs.WithLabelValues("p", "succeeded").Inc()
	m.JobDuration.WithLabelValues("p", "succeeded").Observe(1)
	m.QueueWait.WithLabelValues("p").Observe(1)
	m.SandboxStart.WithLabelValues("bubblewrap").Observe(1)
	m.SandboxExec.WithLabelValues("bubblewrap").Observe(1)
	m.SandboxClose.WithLabelValues("bubblewrap").Observe(1)
	m.SandboxFailed.WithLabelValues("bubblewrap", "start").Inc()
	m.ToolCalls.WithLabelValues("p", "read_file", metrics.ToolOK).Inc()
	m.ModelRequests.WithLabelValues(metrics.ModelOK).Inc()
	m.ModelRequestDuration.WithLabelValues(metrics.ModelOK).Observe(1)
	m.ModelTokens.WithLabelValues("p", "prompt").Inc()
	m.CapHits.WithLabelValues("p", "max_turns").Inc()
	m.DeadLetters.WithLabelValues("invalid_job").Inc()
	problems, err := testutil.GatherAndLint(m.Registry())
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range problems {
		t.Errorf("%s: %s", p.Metric, p.Text)
	}
	families, err := m.Registry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range families {
		name := f.GetName()
		if strings.HasPrefix(name, "go_") || strings.HasPrefix(name, "process_") {
			continue
		}
		if !strings.HasPrefix(name, "boxcar_") {
			t.Errorf("%s: not boxcar_<thing>_<unit>", name)
		}
		for _, s := range f.GetMetric() {
			for _, l := range s.GetLabel() {
				if l.GetName() == "job_id" {
					t.Errorf("%s has a job_id label", name)
				}
			}
		}
	}
}

func TestServe(t *testing.T) {
	m := metrics.New()
	m.Jobs.WithLabelValues("p", "succeeded").Inc()
	var draining, storeChecked atomic.Bool
	draining.Store(true)
	ready := metrics.AllReady(
		metrics.Check{Name: "worker", Func: func(context.Context) error {
			if draining.Load() {
				return errors.New("draining")
			}
			return nil
		}},
		metrics.Check{Name: "store", Func: func(context.Context) error { storeChecked.Store(true); return nil }},
	)
	ctx, cancel := context.WithCancel(context.Background())
	addrs := make(chan string, 1)
	served := make(chan error, 1)
	go func() {
		served <- m.Serve(ctx, "127.0.0.1:0", ready, nil, func(a net.Addr) { addrs <- a.String() })
	}()
	var base string
	select {
	case a := <-addrs:
		base = "http://" + a
	case err := <-served:
		t.Fatalf("Serve: %v", err)
	}
	get := func(path string) (int, string) {
		t.Helper()
		resp, err := http.Get(base + path)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(body)
	}

	if code, _ := get("/healthz"); code != http.StatusOK {
		t.Errorf("/healthz = %d, want 200", code)
	}
	if code, body := get("/readyz"); code != http.StatusServiceUnavailable || !strings.Contains(body, "worker: draining") {
		t.Errorf("/readyz while draining = %d %q, want 503 naming the check", code, body)
	}
	if storeChecked.Load() {
		t.Error("a later check ran after an earlier one failed")
	}
	draining.Store(false)
	if code, _ := get("/readyz"); code != http.StatusOK || !storeChecked.Load() {
		t.Errorf("/readyz = %d (store checked: %v), want 200 after every check", code, storeChecked.Load())
	}
	if code, body := get("/metrics"); code != http.StatusOK || !strings.Contains(body, `boxcar_jobs_total{outcome="succeeded",profile="p"} 1`) {
		t.Errorf("/metrics = %d, lacks the job count:\n%s", code, body)
	}

	cancel()
	select {
	case err := <-served:
		if err != nil {
			t.Errorf("Serve after cancel = %v, want nil", err)
		}
	case <-time.After(harness.Timeout(5 * time.Second)):
		t.Fatal("Serve did not return after its context ended")
	}
}

func TestServeListenError(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	err = metrics.New().Serve(context.Background(), ln.Addr().String(), nil, nil, nil)
	if err == nil {
		t.Fatal("Serve on a taken address succeeded")
	}
}

func TestModelUp(t *testing.T) {
	m := metrics.New()
	tests := []struct {
		name string
		set  func()
		want float64
	}{
		{name: "up from the start", set: func() {}, want: 1},
		{name: "down", set: func() { m.SetModelUp(false) }, want: 0},
		{name: "up again", set: func() { m.SetModelUp(true) }, want: 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tt.set()
			if got := testutil.ToFloat64(m.ModelUp); got != tt.want {
				t.Errorf("boxcar_model_up = %v, want %v", got, tt.want)
			}
		})
	}
}

// TestModelVerdicts: both verdicts are exported from the start, at 0, so that a rate() of
// either reads 0 rather than nothing; each probe's verdict counts one.
func TestModelVerdicts(t *testing.T) {
	m := metrics.New()
	for _, v := range []string{"job", "outage"} {
		if got := testutil.ToFloat64(m.ModelVerdicts.WithLabelValues(v)); got != 0 {
			t.Errorf("verdict %s starts at %v, want 0", v, got)
		}
	}
	m.ModelVerdict(true)
	m.ModelVerdict(true)
	m.ModelVerdict(false)
	for v, want := range map[string]float64{"job": 2, "outage": 1} {
		if got := testutil.ToFloat64(m.ModelVerdicts.WithLabelValues(v)); got != want {
			t.Errorf("boxcar_model_failure_verdicts_total{verdict=%q} = %v, want %v", v, got, want)
		}
	}
}
