package metrics_test

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/boxcar-run/boxcar/internal/metrics"
)

// TestAuditModelBodyFailureNotOK: an answer whose headers said 200 but whose body never
// arrived (the request timed out while the body was read) or was cut (the connection closed
// before Content-Length bytes) is a failed request: the agent got no answer and the client
// retries it. boxcar_model_requests_total must not count it as outcome="ok".
func TestAuditModelBodyFailureNotOK(t *testing.T) {
	t.Parallel()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/stall":
			w.WriteHeader(http.StatusOK)
			_, _ = w.Write([]byte(`{"id":`))
			w.(http.Flusher).Flush()
			<-r.Context().Done()
		case "/cut":
			hj, ok := w.(http.Hijacker)
			if !ok {
				t.Error("no hijacker")
				return
			}
			conn, buf, err := hj.Hijack()
			if err != nil {
				t.Error(err)
				return
			}
			_, _ = buf.WriteString("HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n{\"id\":")
			_ = buf.Flush()
			conn.Close()
		}
	}))
	t.Cleanup(srv.Close)
	tests := []struct {
		name, path string
		timeout    time.Duration
		want       string
	}{
		{"body stalls past the request timeout", "/stall", 300 * time.Millisecond, metrics.ModelTimeout},
		{"body cut short", "/cut", 0, metrics.ModelError},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			m := metrics.New()
			client := &http.Client{Transport: m.ModelTransport(nil)}
			ctx := context.Background()
			if tt.timeout > 0 {
				var cancel context.CancelFunc
				ctx, cancel = context.WithTimeout(ctx, tt.timeout)
				defer cancel()
			}
			req, err := http.NewRequestWithContext(ctx, http.MethodPost, srv.URL+tt.path, strings.NewReader("{}"))
			if err != nil {
				t.Fatal(err)
			}
			resp, err := client.Do(req)
			if err != nil {
				t.Fatalf("the headers should arrive: %v", err)
			}
			_, readErr := io.ReadAll(resp.Body)
			resp.Body.Close()
			if readErr == nil {
				t.Fatal("reading the body succeeded; the test's server is wrong")
			}
			ok := testutil.ToFloat64(m.ModelRequests.WithLabelValues(metrics.ModelOK))
			want := testutil.ToFloat64(m.ModelRequests.WithLabelValues(tt.want))
			if ok != 0 || want != 1 {
				t.Errorf("a request whose body failed (%v): boxcar_model_requests_total{outcome=\"ok\"} = %v, {outcome=%q} = %v; want 0 and 1",
					readErr, ok, tt.want, want)
			}
		})
	}
}
