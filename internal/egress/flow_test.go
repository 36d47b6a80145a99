package egress

import (
	"bufio"
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"slices"
	"strings"
	"sync"
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

// keptConn is a client connection to the proxy that a pooling client keeps between requests:
// forwarded, or a terminated tunnel.
type keptConn struct {
	w   io.Writer
	br  *bufio.Reader
	req string // a whole request for this connection
}

// exchange sends k's request and reads a 200.
func (k keptConn) exchange(t *testing.T) {
	t.Helper()
	if _, err := io.WriteString(k.w, k.req); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(k.br, nil)
	if err != nil {
		t.Fatal(err)
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("status %d", resp.StatusCode)
	}
}

// stall sends the start of k's request, no end to its header, and wants a 408.
func (k keptConn) stall(t *testing.T) {
	t.Helper()
	if _, err := io.WriteString(k.w, k.req[:len(k.req)-10]); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(k.br, nil)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusRequestTimeout {
		t.Fatalf("status %d, want 408", resp.StatusCode)
	}
}

// TestKeepAliveBetweenRequests: a connection a client keeps after a request (every pooling
// client does) may sit idle until idle_timeout; header_timeout runs from a request's first
// byte. The proxy armed header_timeout as soon as a request was answered, so 10 s of pooling
// was recorded as a denied request (header_timeout) that was never made, in the transcript,
// the summary's denials and the metrics; and a header-stage refusal took its Time after the
// header was given up on (Duration: microseconds).
func TestKeepAliveBetweenRequests(t *testing.T) {
	paths := []struct {
		name string
		open func(t *testing.T, h *harness) keptConn
	}{
		{"forwarded", func(t *testing.T, h *harness) keptConn {
			c := h.dialProxy(t)
			if err := c.SetDeadline(time.Now().Add(30 * time.Second)); err != nil {
				t.Fatal(err)
			}
			return keptConn{c, bufio.NewReader(c), getReq("http://plain.example.com/", "plain.example.com")}
		}},
		{"terminated", func(t *testing.T, h *harness) keptConn {
			tc, br := h.terminated(t, "api.example.com:443")
			if err := tc.SetDeadline(time.Now().Add(30 * time.Second)); err != nil {
				t.Fatal(err)
			}
			return keptConn{tc, br, getReq("/", "api.example.com")}
		}},
	}
	// header_timeout also bounds the sandbox's TLS handshake with the job CA on the terminated
	// path: at 200 ms (shortHeaderTimeout) a load of 20 to 30 under -race had the first
	// exchange fail about one run in ten (write: broken pipe, read: connection reset).
	const headerTimeout = time.Second
	const pause = 3 * headerTimeout
	tests := []struct {
		name   string
		tweak  func(*Config)
		run    func(t *testing.T, k keptConn)
		denied bool          // a header_timeout refusal, timed from the stalled request's start:
		from   time.Duration // at least this long after the connection was opened
	}{
		{"a pause past header_timeout, then a request", nil, func(t *testing.T, k keptConn) {
			k.exchange(t)
			time.Sleep(pause)
			k.exchange(t)
		}, false, 0},
		// 4 s, not 1: the idle clock runs from the tunnel's set-up, and a busy machine spent
		// over a second between that and the first request (write: broken pipe).
		{"idle past idle_timeout: closed without a word", func(c *Config) { c.Limits.IdleTimeout = 4 * time.Second }, func(t *testing.T, k keptConn) {
			k.exchange(t)
			if got, err := io.ReadAll(k.br); len(got) != 0 || errors.Is(err, os.ErrDeadlineExceeded) {
				t.Fatalf("read %q, %v; want the connection closed with nothing sent", got, err)
			}
		}, false, 0},
		{"a next request stalled mid-header", nil, func(t *testing.T, k keptConn) {
			k.exchange(t)
			time.Sleep(pause)
			k.stall(t)
		}, true, pause},
		{"a first request stalled mid-header", nil, func(t *testing.T, k keptConn) { k.stall(t) }, true, 0},
	}
	for _, path := range paths {
		for _, tt := range tests {
			t.Run(path.name+"/"+tt.name, func(t *testing.T) {
				t.Parallel() // each mostly waits
				h := setup(t, func(c *Config) {
					c.Limits.HeaderTimeout = headerTimeout
					if tt.tweak != nil {
						tt.tweak(c)
					}
				})
				opened := time.Now()
				k := path.open(t, h)
				tt.run(t, k)
				checkKeptDecisions(t, h, tt.denied, opened.Add(tt.from))
			})
		}
	}
}

// checkKeptDecisions wants every decision allowed, or, when denied, one header_timeout refusal
// timed from its request's start: after before, for at least header_timeout.
func checkKeptDecisions(t *testing.T, h *harness, denied bool, before time.Time) {
	t.Helper()
	var refusals []Decision
	for _, d := range h.all() {
		if !d.Allowed {
			refusals = append(refusals, d)
		}
	}
	if !denied {
		if len(refusals) > 0 || h.proxy.Summary().Denied != 0 {
			t.Fatalf("denied %+v; no request was refused", refusals)
		}
		return
	}
	limit := h.proxy.cfg.Limits.HeaderTimeout
	if len(refusals) != 1 || refusals[0].Reason != ReasonHeaderTimeout || refusals[0].Time.Before(before) || refusals[0].Duration < limit {
		t.Fatalf("denied %+v; want one header_timeout taking at least %v, after %v", refusals, limit, before)
	}
}

// TestIdleIsNoTrafficEitherWay: a tunnel carrying bytes one way only, for three times
// idle_timeout, is not cut: a download the client sends nothing to after its request, an upload
// the server answers only at its end, spliced and terminated. Each direction's read had a
// deadline of its own, so the silent side timed out while the other still flowed (a spliced
// download was cut at idle_timeout, 5 min by default; a terminated upload when the Transport's
// read of the answer timed out). The gaps between lines are a twentieth of idle_timeout: a
// machine would have to stall for 3.8 s to fail it (a busy CI box has stalled a goroutine for
// 3 s). The rows run at once (12 s in all), not as parallel subtests, which -parallel holds to
// the machine's two cores.
func TestIdleIsNoTrafficEitherWay(t *testing.T) {
	const idle, every, lines = 4 * time.Second, 200 * time.Millisecond, 60 // 12 s of traffic
	tests := []struct {
		name, host string
		upload     bool
	}{
		{"spliced download", "pkg.example.com", false},
		{"spliced upload", "pkg.example.com", true},
		{"terminated download", "api.example.com", false},
		{"terminated upload", "api.example.com", true},
	}
	var wg sync.WaitGroup
	for _, tt := range tests {
		h := setup(t, func(c *Config) { c.Limits.IdleTimeout = idle })
		cl := h.client(t)
		wg.Go(func() {
			if err := transfer(cl, tt.host, tt.upload, lines, every); err != nil {
				t.Errorf("%s (idle_timeout %v): %v", tt.name, idle, err)
			}
		})
	}
	wg.Wait()
}

// transfer downloads lines from host's /stream, or uploads them to its /up, one every every,
// and reports what went wrong.
func transfer(cl *http.Client, host string, upload bool, lines int, every time.Duration) error {
	var want string
	for i := range lines {
		want += streamLine(i)
	}
	req, _ := http.NewRequest(http.MethodGet, fmt.Sprintf("https://%s/stream?n=%d&every=%s", host, lines, every), nil)
	if upload {
		req, _ = http.NewRequest(http.MethodPost, "https://"+host+"/up", &slowBody{n: lines, every: every})
		want = fmt.Sprintf("%d bytes in", len(want))
	}
	start := time.Now()
	resp, err := cl.Do(req)
	if err != nil {
		return fmt.Errorf("after %v: %w", time.Since(start).Round(time.Millisecond), err)
	}
	defer resp.Body.Close()
	got, err := io.ReadAll(resp.Body)
	if err != nil || !strings.HasSuffix(string(got), want) {
		return fmt.Errorf("after %v: read %d bytes (%v), want %d ending %q", time.Since(start).Round(time.Millisecond),
			len(got), err, len(want), want[max(len(want)-9, 0):])
	}
	return nil
}

// slowBody is an upload of n lines, one every every.
type slowBody struct {
	n, sent int
	every   time.Duration
}

func (b *slowBody) Read(p []byte) (int, error) {
	if b.sent == b.n {
		return 0, io.EOF
	}
	if b.sent > 0 {
		time.Sleep(b.every)
	}
	b.sent++
	return copy(p, streamLine(b.sent-1)), nil
}

// TestIdleTunnelCloses: a spliced tunnel with no traffic either way is closed after
// idle_timeout, and its decision says so.
func TestIdleTunnelCloses(t *testing.T) {
	const idle = time.Second
	h := setup(t, func(c *Config) { c.Limits.IdleTimeout = idle })
	c := h.connectOK(t, "pkg.example.com:443")
	tc := tls.Client(c, &tls.Config{ServerName: "pkg.example.com", RootCAs: h.upCA})
	if err := tc.Handshake(); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	if err := tc.SetReadDeadline(start.Add(30 * time.Second)); err != nil {
		t.Fatal(err)
	}
	_, err := io.ReadAll(tc)
	took := time.Since(start)
	if errors.Is(err, os.ErrDeadlineExceeded) || took < idle/2 {
		t.Fatalf("closed after %v (%v), want after idle_timeout %v", took, err, idle)
	}
	d := h.waitDecision(t, "the tunnel's", func(d Decision) bool { return d.Method == http.MethodConnect })
	if !d.Allowed || !strings.Contains(d.Detail, "idle_timeout") {
		t.Fatalf("decision %+v, want allowed, closed at idle_timeout", d)
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
	}, testharness.Within(30*time.Second))
	testharness.Wait(t, "upstream connections within the tunnel cap", func() (bool, error) {
		if n := h.dialer.openConns(); n > tunnelCap {
			return false, fmt.Errorf("%d upstream connections open, tunnel cap %d", n, tunnelCap)
		}
		return true, nil
	}, testharness.Within(30*time.Second)) // what a busy machine may take; a pool that keeps them fails the same
}

// TestTunnelNextRequest: a terminated tunnel reads its next request only once the upstream
// has taken the previous one's body whole. An upstream that answers first (a refused upload)
// leaves the Transport reading the rest of the body from the sandbox's stream: reading a
// request beside it raced on the stream and framed body bytes as requests, so the tunnel ends.
func TestTunnelNextRequest(t *testing.T) {
	smuggled := "GET /smuggled HTTP/1.1\r\nHost: api.example.com\r\n\r\n"
	const early = "POST /early HTTP/1.1\r\nHost: api.example.com\r\nContent-Length: 100000\r\n\r\n0123456789"
	tests := []struct {
		name     string
		first    string // a request and what of its body goes before the answer
		rest     string // the rest of its body, sent after the answer
		wantNext bool   // the tunnel then carries another request
	}{
		{"body taken whole", "POST /up HTTP/1.1\r\nHost: api.example.com\r\nContent-Length: 5\r\n\r\nhello", "", true},
		{"chunked body taken whole", "POST /up HTTP/1.1\r\nHost: api.example.com\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n", "", true},
		{"no body", "GET /a HTTP/1.1\r\nHost: api.example.com\r\n\r\n", "", true},
		{"answered before the body", early, smuggled + strings.Repeat("x", 100000-10-len(smuggled)), false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := setup(t, nil)
			tc, br := h.terminated(t, "api.example.com:443")
			if _, err := io.WriteString(tc, tt.first); err != nil {
				t.Fatal(err)
			}
			resp, err := http.ReadResponse(br, nil)
			if err != nil {
				t.Fatalf("first answer: %v", err)
			}
			resp.Body.Close()
			// The tunnel may be closed already: what matters is what is read back.
			_, _ = io.WriteString(tc, tt.rest+"GET /next HTTP/1.1\r\nHost: api.example.com\r\n\r\n")
			resp, err = http.ReadResponse(br, nil)
			if resp != nil {
				resp.Body.Close()
			}
			if got := err == nil && resp.StatusCode == http.StatusOK; got != tt.wantNext {
				t.Fatalf("next request answered: %v (%v), want %v", got, err, tt.wantNext)
			}
			for _, r := range h.tlsUp.all() {
				if r.URL.Path == "/smuggled" {
					t.Fatal("body bytes went upstream as a request")
				}
			}
		})
	}
}

// terminated opens a terminated tunnel, trusting the job CA, with a read deadline.
func (h *harness) terminated(t *testing.T, authority string) (*tls.Conn, *bufio.Reader) {
	t.Helper()
	c := h.connectOK(t, authority)
	roots := x509.NewCertPool()
	roots.AppendCertsFromPEM(h.proxy.CACertPEM())
	host, _, _ := net.SplitHostPort(authority)
	tc := tls.Client(c, &tls.Config{ServerName: host, RootCAs: roots})
	if err := tc.SetDeadline(time.Now().Add(10 * time.Second)); err != nil {
		t.Fatal(err)
	}
	return tc, bufio.NewReader(tc)
}

// TestUpstreamHeaderCap: an upstream's response header is read within a bound on every path:
// the proxy parses it before the byte cap sees a byte, so an allowed server a job controls
// could otherwise make the worker hold as much as it sends.
func TestUpstreamHeaderCap(t *testing.T) {
	for _, url := range []string{"http://plain.example.com/bighead", "https://api.example.com/bighead"} {
		t.Run(url, func(t *testing.T) {
			h := setup(t, nil)
			resp, err := h.client(t).Get(url)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			if resp.StatusCode != http.StatusBadGateway {
				t.Fatalf("status %d, want 502 for a 2 MiB response header", resp.StatusCode)
			}
		})
	}
}

// TestPooledRequestRecordsItsAddress: a request in a terminated tunnel that goes on a pooled
// upstream connection, dialled for an earlier tunnel to another of the host's addresses, is
// recorded with the address it went to. Each tunnel resolves its host anew, and the decision
// said the address this tunnel resolved, which the proxy never dialled.
func TestPooledRequestRecordsItsAddress(t *testing.T) {
	const second = "198.18.0.14" // api.example.com's next answer
	h := setup(t, nil)
	h.resolver.names["api.example.com"] = [][]netip.Addr{{netip.MustParseAddr(apiAddr)}, {netip.MustParseAddr(second)}}
	h.dialer.routes[second+":443"] = h.dialer.routes[apiAddr+":443"]
	for range 2 {
		if status, _ := get(t, h, "https://api.example.com/", h.placeholder(t)); status != http.StatusOK {
			t.Fatalf("status %d", status)
		}
	}
	dialled := h.dialer.seen()
	if len(dialled) != 1 {
		t.Fatalf("dialled %v, want one connection, pooled", dialled)
	}
	var got []string
	// A request is decided once its answer is through: the client may have it first.
	testharness.Wait(t, "both requests decided", func() (bool, error) {
		got = nil
		for _, d := range h.all() {
			if notConnect(d) {
				got = append(got, d.Addr)
			}
		}
		return len(got) == 2, fmt.Errorf("decided %v", got)
	}, testharness.Within(30*time.Second))
	if !slices.Equal(got, []string{dialled[0], dialled[0]}) {
		t.Errorf("the requests were recorded as sent to %v; both went to %s, the one address dialled", got, dialled[0])
	}
}
