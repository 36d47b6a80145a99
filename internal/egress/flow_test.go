package egress

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"syscall"
	"testing"
	"time"

	testharness "github.com/boxcar-run/boxcar/test/harness"
)

// TestBodies: request bodies (known length, chunked, with Expect: 100-continue) arrive whole
// through a forwarded request and a terminated tunnel.
func TestBodies(t *testing.T) {
	const size = 300 << 10
	for _, url := range []string{"http://plain.example.com/up", "https://api.example.com/up"} {
		for _, shape := range []string{"length", "chunked", "expect"} {
			t.Run(url+" "+shape, func(t *testing.T) {
				h := setup(t, nil)
				var body io.Reader = bytes.NewReader(bytes.Repeat([]byte("x"), size))
				if shape == "chunked" {
					body = io.MultiReader(body) // hides the length: the client sends chunks
				}
				req, _ := http.NewRequest(http.MethodPost, url, body)
				if shape == "expect" {
					req.Header.Set("Expect", "100-continue")
				}
				resp, err := h.client(t).Do(req)
				if err != nil {
					t.Fatal(err)
				}
				defer resp.Body.Close()
				got, _ := io.ReadAll(resp.Body)
				if want := fmt.Sprintf("%d bytes in", size); !strings.HasSuffix(string(got), want) {
					t.Fatalf("upstream answered %q, want %q", got, want)
				}
			})
		}
	}
}

// TestTunnelKeepAlive: requests on one terminated tunnel share one upstream connection, and
// each is a decision of its own.
func TestTunnelKeepAlive(t *testing.T) {
	h := setup(t, nil)
	c := h.client(t)
	c.Transport.(*http.Transport).DisableKeepAlives = false
	for i := range 3 {
		resp, err := c.Get(fmt.Sprintf("https://api.example.com/%d", i))
		if err != nil {
			t.Fatal(err)
		}
		if _, err := io.Copy(io.Discard, resp.Body); err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
	}
	// The proxy records a decision from its own goroutine, which may come after the client
	// has read the answer.
	inner := 0
	testharness.Wait(t, "the third request's decision", func() (bool, error) {
		inner = 0
		for _, d := range h.all() {
			if d.Method == http.MethodGet && d.Reason == ReasonIntercepted {
				inner++
			}
		}
		return inner >= 3, nil
	})
	if n := len(h.dialer.seen()); inner != 3 || n != 1 {
		t.Fatalf("%d requests decided, %d upstream dials; want 3 and 1", inner, n)
	}
}

// TestServeStops: ending the context closes open tunnels and connections, and Serve returns.
func TestServeStops(t *testing.T) {
	h := setup(t, nil)
	tunnel := h.connectOK(t, "pkg.example.com:443")
	idle := h.dialProxy(t)
	if err := h.stop(); err != nil {
		t.Fatalf("Serve: %v", err)
	}
	for _, c := range []io.Reader{tunnel, idle} {
		// ReadAll returns once the proxy closed it: EOF, or a reset when bytes were unread.
		if _, err := io.ReadAll(c); err != nil && !errors.Is(err, syscall.ECONNRESET) {
			t.Fatalf("want the connection closed, got %v", err)
		}
	}
}

// TestUpstreamPooled: new sandbox connections to the bound host reuse the proxy's verified
// upstream connection, so each pays one TLS handshake, not two.
func TestUpstreamPooled(t *testing.T) {
	h := setup(t, nil)
	for range 3 {
		if status, _ := get(t, h, "https://api.example.com/", h.placeholder(t)); status != http.StatusOK {
			t.Fatalf("status %d", status)
		}
	}
	if n := len(h.dialer.seen()); n != 1 {
		t.Fatalf("%d upstream dials for 3 connections, want 1", n)
	}
}

// TestUpstreamNotVerified: an upstream whose certificate does not verify gets no request, so
// no secret.
func TestUpstreamNotVerified(t *testing.T) {
	otherCA, _, _ := testUpstreamCert(t, "api.example.com")
	h := setup(t, func(c *Config) { c.UpstreamCAPEM = otherCA })
	req, _ := http.NewRequest(http.MethodGet, "https://api.example.com/", nil)
	req.Header.Set("Authorization", "Bearer "+h.placeholder(t))
	resp, err := h.client(t).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusBadGateway || Reason(resp.Header.Get("X-Boxcar-Egress")) != ReasonUpstreamTLS {
		t.Fatalf("answer %d %s, want 502 upstream_tls", resp.StatusCode, resp.Header.Get("X-Boxcar-Egress"))
	}
	if n := h.tlsUp.count(); n != 0 {
		t.Fatalf("the unverified upstream got %d requests", n)
	}
}

// TestUpstreamPoolWithinTunnelCap: the upstream connections kept alive for terminated tunnels
// count against the job's tunnel cap too. Without a bound, a job cycling through the ports
// (or the names, for a wildcard) a secret is bound to left one idle upstream connection per
// host:port behind each closed tunnel, as many as its request cap, on the worker's sockets.
func TestUpstreamPoolWithinTunnelCap(t *testing.T) {
	const tunnelCap = 2
	h := setup(t, func(c *Config) { c.Limits.MaxTunnels = tunnelCap })
	ports := []string{"443", "8443", "9443", "10443"}
	h.dialer.mu.Lock()
	for _, port := range ports {
		h.dialer.routes[apiAddr+":"+port] = h.dialer.routes[apiAddr+":443"]
	}
	h.dialer.mu.Unlock()
	for _, port := range ports { // one tunnel each, closed after its request
		if status, _ := get(t, h, "https://api.example.com:"+port+"/", "x"); status != http.StatusOK {
			t.Fatalf("port %s: status %d", port, status)
		}
	}
	testharness.Wait(t, "the sandbox's tunnels to close", func() (bool, error) {
		return h.proxy.tunnels.Load() == 0, nil
	}, testharness.Within(5*time.Second))
	testharness.Wait(t, "upstream connections within the tunnel cap", func() (bool, error) {
		if n := h.dialer.openConns(); n > tunnelCap {
			return false, fmt.Errorf("%d upstream connections open, tunnel cap %d", n, tunnelCap)
		}
		return true, nil
	}, testharness.Within(2*time.Second))
}
