//go:build integration

package submitcmd

import (
	"bytes"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/boxcar-run/boxcar/internal/store/s3test"
)

// faultyProxy stands in front of srv and answers the first n requests with fault, then passes
// every request on: a store that is throttling, failing or dropping connections for a while.
func faultyProxy(t *testing.T, srv *s3test.Server, n int64, fault func(w http.ResponseWriter)) string {
	t.Helper()
	return proxyTo(t, srv, httptest.NewServer, n, fault)
}

// proxyTo is faultyProxy served by start (plain HTTP or TLS with a certificate of its own).
func proxyTo(t *testing.T, srv *s3test.Server, start func(http.Handler) *httptest.Server, n int64, fault func(w http.ResponseWriter)) string {
	t.Helper()
	target, err := url.Parse(srv.Endpoint)
	if err != nil {
		t.Fatal(err)
	}
	rp := httputil.NewSingleHostReverseProxy(target)
	var seen atomic.Int64
	h := start(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if seen.Add(1) <= n {
			fault(w)
			return
		}
		rp.ServeHTTP(w, r)
	}))
	t.Cleanup(h.Close)
	return h.URL
}

// s3Error answers as S3 does when it fails a request with status and code.
func s3Error(status int, code string) func(http.ResponseWriter) {
	return func(w http.ResponseWriter) {
		w.Header().Set("Content-Type", "application/xml")
		w.WriteHeader(status)
		_, _ = w.Write([]byte(`<?xml version="1.0" encoding="UTF-8"?><Error><Code>` + code + `</Code><Message>injected</Message></Error>`))
	}
}

// reset drops the connection with a TCP reset, as a load balancer restarting does.
func reset(w http.ResponseWriter) {
	conn, _, err := w.(http.Hijacker).Hijack()
	if err != nil {
		return
	}
	_ = conn.(*net.TCPConn).SetLinger(0)
	_ = conn.Close()
}

// TestRunStoreFaults: a store fault that may pass (throttling, a 500, a connection reset,
// each for more requests than the SDK's own three attempts) is waited out by run, which then
// queues the job once; one that waiting cannot change (no credentials, a wrong secret key, a
// bucket that is not there, a certificate no CA given vouches for) ends run at once, exit 1, naming the store and with nothing
// queued. Without credentials, run waited out its whole --timeout (30 minutes by default)
// saying "waiting for the store: … get credentials …", as for an outage. A server that ignores
// If-None-Match (the workers' store.allow_unsafe_overwrite) takes the inputs: run waited out its
// --timeout for it, then named that worker setting.
func TestRunStoreFaults(t *testing.T) {
	srv := s3test.Start(t)
	bucket := srv.CreateBucket(t)
	creds := srv.Vars()
	tests := []struct {
		name     string
		endpoint func(t *testing.T) string
		bucket   string
		env      map[string]string // the AWS settings run is given
		refused  bool
	}{
		{name: "throttled", endpoint: func(t *testing.T) string { return faultyProxy(t, srv, 4, s3Error(503, "SlowDown")) }},
		{name: "internal error", endpoint: func(t *testing.T) string { return faultyProxy(t, srv, 4, s3Error(500, "InternalError")) }},
		{name: "connection reset", endpoint: func(t *testing.T) string { return faultyProxy(t, srv, 4, reset) }},
		// The workers run on it with store.allow_unsafe_overwrite; an input is content-addressed,
		// so a create-only put of it that overwrites writes the same bytes.
		{name: "a server that ignores If-None-Match", endpoint: func(t *testing.T) string { return s3test.NewLenientProxy(t, srv, s3test.IgnorePut).URL }},
		{name: "a certificate no CA given vouches for", endpoint: func(t *testing.T) string { return proxyTo(t, srv, httptest.NewTLSServer, 0, nil) }, refused: true},
		{name: "no credentials", env: map[string]string{"AWS_ACCESS_KEY_ID": "", "AWS_SECRET_ACCESS_KEY": ""}, refused: true},
		{name: "wrong secret key", env: map[string]string{"AWS_SECRET_ACCESS_KEY": "wrong-secret-key"}, refused: true},
		{name: "no such bucket", bucket: "no-such-bucket", refused: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s3test.IsolateEnv(t) // nothing but what run is given: no shared files, no instance metadata
			te := newTestEnv(t)
			endpoint, b := srv.Endpoint, bucket
			if tt.endpoint != nil {
				endpoint = tt.endpoint(t)
			}
			if tt.bucket != "" {
				b = tt.bucket
			}
			vars := map[string]string{"NATS_URL": te.natsURL, "BOXCAR_HOME": te.home}
			for k, v := range creds {
				vars[k] = v
			}
			for k, v := range tt.env {
				vars[k] = v
			}
			input := writeTestFile(t, t.TempDir(), "sales.csv", "region,total\nnorth,3\n")
			var stdout, stderr bytes.Buffer
			err := Run(t.Context(), []string{"run", "--profile", "csv-analyst", "--task", "t", "--input", input, "--timeout", "20s",
				"--store", "s3://" + b, "--s3-endpoint", endpoint}, func(k string) string { return vars[k] }, &stdout, &stderr)
			switch {
			case tt.refused && (exitCode(err) != 1 || strings.Contains(message(err), "gave up") || strings.Contains(stderr.String(), "waiting for") ||
				!strings.Contains(message(err), "s3://"+b)):
				t.Errorf("run: exit %d (%v), stderr %q; want exit 1 at once, naming s3://%s, not waited for", exitCode(err), err, stderr.String(), b)
			case !tt.refused && err != nil:
				t.Errorf("run: %v, stderr %q; want the fault waited out", err, stderr.String())
			}
			want := 1
			if tt.refused {
				want = 0
			}
			if got := te.jobMessages(t); got != want {
				t.Errorf("%d jobs queued, want %d", got, want)
			}
		})
	}
}
