package egress

import (
	"crypto/tls"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
)

// TestStoredEchoOverPlainHTTPIsScrubbed: a host a secret is bound to that keeps what it got
// (a request log, a stored field) and serves it on plain http:// too hands the value back on
// a forwarded request, which the proxy passed to the sandbox unscrubbed: the value went in on
// TLS, swapped for its placeholder, and came out of the same host by another scheme. A
// forwarded request to a host a secret is bound to, on any port, has its answer scrubbed of
// the host's values as a terminated tunnel's is, compressed or not.
func TestStoredEchoOverPlainHTTPIsScrubbed(t *testing.T) {
	var mu sync.Mutex
	var stored string
	handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		defer mu.Unlock()
		if r.URL.Path == "/store" {
			stored = r.Header.Get("Authorization")
			return
		}
		echo(w, &http.Request{Header: http.Header{"X-Echo": {stored}, "Accept-Encoding": r.Header["Accept-Encoding"]}})
	})
	caPEM, _, leaf := testUpstreamCert(t, "api.example.com")
	tlsSrv := httptest.NewUnstartedServer(handler)
	tlsSrv.TLS = &tls.Config{Certificates: []tls.Certificate{leaf}}
	tlsSrv.StartTLS()
	t.Cleanup(tlsSrv.Close)
	plainSrv := httptest.NewServer(handler)
	t.Cleanup(plainSrv.Close)
	h := setup(t, func(c *Config) { c.UpstreamCAPEM = caPEM })
	h.dialer.routes[apiAddr+":443"], h.dialer.routes[apiAddr+":80"] = tlsSrv.Listener.Addr().String(), plainSrv.Listener.Addr().String()
	ph := h.placeholder(t)
	if status, _ := get(t, h, "https://api.example.com/store", ph); status != http.StatusOK {
		t.Fatalf("storing: status %d", status)
	}
	for _, enc := range []string{"", "gzip"} {
		req, _ := http.NewRequest(http.MethodGet, "http://api.example.com/stored", nil)
		req.Header.Set("Accept-Encoding", enc)
		resp, err := h.client(t).Do(req)
		if err != nil {
			t.Fatal(err)
		}
		raw, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		seen := string(raw) + resp.Header.Get("X-Echo") + resp.Trailer.Get("X-Echo")
		if strings.Contains(seen, realToken) || resp.Header.Get("Content-Encoding") != "" {
			t.Errorf("Accept-Encoding %q: the sandbox read the stored value back over plain http (encoded %q)", enc, resp.Header.Get("Content-Encoding"))
		}
		if !strings.Contains(string(raw), ph) {
			t.Errorf("Accept-Encoding %q: the answer %q has not the placeholder", enc, redact(string(raw)))
		}
	}
}
