package egress

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"regexp"
	"strings"
	"sync/atomic"
	"testing"

	testharness "github.com/boxcar-run/boxcar/test/harness"
)

// panicDialer panics, once, where its row says: in the dial, or in a write of the connection
// it gave once more than 16 KiB went through it (an upload, past any TLS handshake: the
// Transport's write loop in a terminated tunnel, a spliced tunnel's copy goroutine).
type panicDialer struct {
	Dialer
	inDial, inWrite bool
	armed           *atomic.Bool
}

func (d panicDialer) DialContext(ctx context.Context, network, addr string) (net.Conn, error) {
	if d.inDial && d.armed.CompareAndSwap(true, false) {
		panic("stub dialer: a bug")
	}
	c, err := d.Dialer.DialContext(ctx, network, addr)
	if err != nil || !d.inWrite {
		return c, err
	}
	return &panicConn{Conn: c, armed: d.armed}, nil
}

type panicConn struct {
	net.Conn
	armed   *atomic.Bool
	written atomic.Int64
}

func (c *panicConn) Write(b []byte) (int, error) {
	if c.written.Add(int64(len(b))) > 16<<10 && c.armed.CompareAndSwap(true, false) {
		panic("stub connection: a bug")
	}
	return c.Conn.Write(b)
}

// panicResolver panics, once, on the first lookup of a request's host, or of only when set.
type panicResolver struct {
	Resolver
	armed *atomic.Bool
	only  string
}

func (r panicResolver) LookupNetIP(ctx context.Context, network, name string) ([]netip.Addr, error) {
	if strings.HasSuffix(name, ".") && (r.only == "" || name == r.only) && r.armed.CompareAndSwap(true, false) {
		panic("stub resolver: a bug")
	}
	return r.Resolver.LookupNetIP(ctx, network, name)
}

// panicLine is the proxy's log line of a panic it recovered.
var panicLine = regexp.MustCompile(`"level":"ERROR","msg":"egress: the proxy panicked`)

// TestPanicFailsItsRequestAndTheProxyGoesOn: a panic in what the proxy is given (its Dialer,
// its Resolver, a connection the Dialer made) or runs for net/http (the Transport's dial and
// write loop, in goroutines of the Transport's own) fails that request, proxy_error, 502
// where the sandbox can still read one, logged; the proxy serves the next request. With the
// default Config.Go, a go statement, nothing else recovers it: a panic in the Transport's
// goroutines ended the test binary, as it ended the worker's process, whatever Go was.
func TestPanicFailsItsRequestAndTheProxyGoesOn(t *testing.T) {
	paths := []struct{ name, url string }{
		{"forwarded", "http://plain.example.com/up"},
		{"spliced", "https://pkg.example.com/up"},
		{"terminated", "https://api.example.com/up"},
	}
	where := []struct {
		name  string
		tweak func(c *Config, armed *atomic.Bool)
	}{
		{"dial", func(c *Config, armed *atomic.Bool) {
			c.Dialer = panicDialer{Dialer: c.Dialer, inDial: true, armed: armed}
		}},
		{"upstream write", func(c *Config, armed *atomic.Bool) {
			c.Dialer = panicDialer{Dialer: c.Dialer, inWrite: true, armed: armed}
		}},
		{"resolve", func(c *Config, armed *atomic.Bool) { c.Resolver = panicResolver{Resolver: c.Resolver, armed: armed} }},
		// The bound host's look-up, on a goroutine of its own (resolveHeld) for the other paths.
		{"resolve the bound host", func(c *Config, armed *atomic.Bool) {
			c.Resolver = panicResolver{Resolver: c.Resolver, armed: armed, only: "api.example.com."}
		}},
	}
	for _, w := range where {
		for _, path := range paths {
			t.Run(w.name+", "+path.name, func(t *testing.T) {
				armed := &atomic.Bool{}
				armed.Store(true)
				h := setup(t, func(c *Config) { w.tweak(c, armed) })
				client := h.client(t)
				resp, err := client.Post(path.url, "application/octet-stream", strings.NewReader(strings.Repeat("u", 64<<10)))
				if err == nil {
					resp.Body.Close()
					if resp.StatusCode != http.StatusBadGateway || Reason(resp.Header.Get("X-Boxcar-Egress")) != ReasonProxyError {
						t.Errorf("the request the proxy panicked in got %d %q; want 502 proxy_error", resp.StatusCode, resp.Header.Get("X-Boxcar-Egress"))
					}
				}
				d := h.waitDecision(t, "the request the proxy panicked in", func(d Decision) bool { return d.Reason == ReasonProxyError })
				if d.Allowed || !strings.Contains(d.Detail, "panic") {
					t.Errorf("decision %+v; want denied, its detail saying the proxy panicked", d)
				}
				if armed.Load() {
					t.Fatal("the stub never panicked: the row tests nothing")
				}
				testharness.Wait(t, "the panic's log line", func() (bool, error) { return h.logs.Count(panicLine) > 0, nil })
				if n := h.logs.Count(panicLine); n != 1 || strings.Contains(h.logs.String(), "a bug") {
					t.Errorf("%d log lines of the panic, its value quoted: %v; want 1, not quoted (a value may hold a secret):\n%s",
						n, strings.Contains(h.logs.String(), "a bug"), h.logs.String())
				}
				resp, err = client.Post(path.url, "text/plain", strings.NewReader("again"))
				if err != nil {
					t.Fatalf("the next request: %v; want the proxy serving it", err)
				}
				resp.Body.Close()
				if resp.StatusCode != http.StatusOK {
					t.Errorf("the next request got %d; want 200", resp.StatusCode)
				}
			})
		}
	}
}

// secretPanic panics, once, with a value that quotes the secret's real value, where its row
// says: the Transport's dial, or a connection's look-up.
type secretPanic struct {
	Dialer
	Resolver
	inDial bool
	armed  *atomic.Bool
}

func (s secretPanic) DialContext(ctx context.Context, network, addr string) (net.Conn, error) {
	if s.inDial && s.armed.CompareAndSwap(true, false) {
		panic("stub dialer: a bug holding " + realToken)
	}
	return s.Dialer.DialContext(ctx, network, addr)
}

func (s secretPanic) LookupNetIP(ctx context.Context, network, name string) ([]netip.Addr, error) {
	if !s.inDial && strings.HasSuffix(name, ".") && s.armed.CompareAndSwap(true, false) {
		panic("stub resolver: a bug holding " + realToken)
	}
	return s.Resolver.LookupNetIP(ctx, network, name)
}

// TestPanicReachesItsGuardWithoutItsValue: what a panic hands Config.Go's guard says where it
// was and its stack, never its value, which may quote what the proxy was handling (a header
// with a secret swapped in): the worker's guard (runner's recoverAs) logs fmt.Sprint of what
// it recovers and ends the attempt with it, so the value the default guard keeps out of the
// log reached the worker's log whole, on a Transport's goroutine (raised again) and on a
// connection's (panicking on).
func TestPanicReachesItsGuardWithoutItsValue(t *testing.T) {
	for _, inDial := range []bool{true, false} {
		t.Run(map[bool]string{true: "dial", false: "resolve"}[inDial], func(t *testing.T) {
			armed := &atomic.Bool{}
			armed.Store(true)
			guarded := make(chan string, 1)
			h := setup(t, func(c *Config) {
				c.Dialer = secretPanic{Dialer: c.Dialer, inDial: inDial, armed: armed}
				c.Resolver = secretPanic{Resolver: c.Resolver, inDial: inDial, armed: armed}
				c.Go = func(f func()) { // as the worker's guard: the value printed
					go func() {
						defer func() {
							if r := recover(); r != nil {
								guarded <- fmt.Sprint(r)
							}
						}()
						f()
					}()
				}
			})
			resp, err := h.client(t).Get("https://api.example.com/up")
			if err == nil {
				resp.Body.Close()
			}
			got := <-guarded
			if strings.Contains(got, realToken) || strings.Contains(got, "a bug") || !strings.Contains(got, "egress proxy's") {
				t.Errorf("the guard got %q; want where the panic was, without its value", redact(got))
			}
		})
	}
}
