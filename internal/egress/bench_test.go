package egress

import (
	"context"
	"crypto/tls"
	"io"
	"net"
	"net/http"
	"slices"
	"testing"
	"time"
)

// BenchmarkProxyHTTPS times one HTTPS GET on a new connection through the proxy and one
// directly to the same loopback server, interleaved in the same run, and reports the p50 and
// p99 of each and the proxy's overhead (proxied minus direct, at each percentile). splice is a
// host without a secret (CONNECT, SNI check, pass-through); intercept is the secret-bound host
// (TLS terminated with the job CA, the upstream verified, the placeholder swapped).
func BenchmarkProxyHTTPS(b *testing.B) {
	for _, bb := range []struct{ name, host string }{{"splice", "pkg.example.com"}, {"intercept", "api.example.com"}} {
		b.Run(bb.name, func(b *testing.B) {
			h := setup(b, nil)
			ph := h.placeholder(b)
			proxied, direct := h.client(b), h.directClient(b)
			url := "https://" + bb.host + "/bench"
			var viaProxy, viaDirect []time.Duration
			b.ResetTimer()
			for b.Loop() {
				viaDirect = append(viaDirect, timeGet(b, direct, url, ph))
				viaProxy = append(viaProxy, timeGet(b, proxied, url, ph))
			}
			b.StopTimer()
			reportPercentiles(b, viaProxy, viaDirect)
		})
	}
}

// directClient reaches the TLS upstream without the proxy, trusting its CA.
func (h *harness) directClient(tb testing.TB) *http.Client {
	addr := h.dialer.routes[apiAddr+":443"]
	tr := &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "tcp", addr)
		},
		TLSClientConfig:   &tls.Config{RootCAs: h.upCA},
		DisableKeepAlives: true,
	}
	tb.Cleanup(tr.CloseIdleConnections)
	return &http.Client{Transport: tr}
}

func timeGet(tb testing.TB, c *http.Client, url, token string) time.Duration {
	start := time.Now()
	req, _ := http.NewRequest(http.MethodGet, url, nil)
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := c.Do(req)
	if err != nil {
		tb.Fatalf("GET %s: %v", url, err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		tb.Fatalf("GET %s: %d", url, resp.StatusCode)
	}
	return time.Since(start)
}

func reportPercentiles(b *testing.B, proxied, direct []time.Duration) {
	slices.Sort(proxied)
	slices.Sort(direct)
	pct := func(d []time.Duration, p float64) float64 {
		return float64(d[int(p*float64(len(d)-1))]) / float64(time.Millisecond)
	}
	b.ReportMetric(pct(proxied, .5), "proxied-p50-ms")
	b.ReportMetric(pct(proxied, .99), "proxied-p99-ms")
	b.ReportMetric(pct(direct, .5), "direct-p50-ms")
	b.ReportMetric(pct(direct, .99), "direct-p99-ms")
	b.ReportMetric(pct(proxied, .5)-pct(direct, .5), "overhead-p50-ms")
	b.ReportMetric(pct(proxied, .99)-pct(direct, .99), "overhead-p99-ms")
	b.ReportMetric(0, "ns/op") // the figures above are the result; ns/op would mix both
}

// BenchmarkCAAndFirstLeaf is what a job pays for its CA: the key and certificate made at New,
// and the first leaf, signed when the sandbox first reaches a secret-bound host.
func BenchmarkCAAndFirstLeaf(b *testing.B) {
	var total time.Duration
	for b.Loop() {
		start := time.Now()
		a, err := newAuthority(24*time.Hour, []string{"api.example.com"}, nil)
		if err != nil {
			b.Fatal(err)
		}
		if _, err := a.leaf("api.example.com"); err != nil {
			b.Fatal(err)
		}
		total += time.Since(start)
	}
	b.ReportMetric(float64(total)/float64(b.N)/float64(time.Millisecond), "ms/ca+leaf")
}

// BenchmarkGuardedConn is the cost of guardedConn's deferred recover on each Read and Write of
// an upstream connection: over a connection that does nothing (the guard alone) and over a
// loopback TCP connection moving 32 KiB a call (the guard beside the syscall it wraps).
func BenchmarkGuardedConn(b *testing.B) {
	p := &Proxy{}
	buf := make([]byte, 32<<10)
	for _, bb := range []struct {
		name string
		conn func(b *testing.B) (w, r net.Conn)
	}{{"nop", func(*testing.B) (net.Conn, net.Conn) { return nopConn{}, nopConn{} }}, {"loopback", loopbackPair}} {
		for _, guarded := range []bool{false, true} {
			name := bb.name + "/bare"
			if guarded {
				name = bb.name + "/guarded"
			}
			b.Run(name, func(b *testing.B) {
				w, r := bb.conn(b)
				if guarded {
					w, r = &guardedConn{Conn: w, p: p}, &guardedConn{Conn: r, p: p}
				}
				b.SetBytes(int64(len(buf)))
				for b.Loop() {
					if _, err := w.Write(buf); err != nil {
						b.Fatal(err)
					}
					if _, err := io.ReadFull(r, buf); err != nil {
						b.Fatal(err)
					}
				}
			})
		}
	}
}

// nopConn reads and writes whole buffers and does nothing else.
type nopConn struct{ net.Conn }

func (nopConn) Read(b []byte) (int, error)  { return len(b), nil }
func (nopConn) Write(b []byte) (int, error) { return len(b), nil }

// loopbackPair is the two ends of a TCP connection on 127.0.0.1.
func loopbackPair(b *testing.B) (net.Conn, net.Conn) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	defer ln.Close()
	w, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		b.Fatal(err)
	}
	r, err := ln.Accept()
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { w.Close(); r.Close() })
	return w, r
}
