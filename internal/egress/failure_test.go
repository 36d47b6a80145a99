package egress

import (
	"bufio"
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/boxcar-run/boxcar/internal/testnet"
	testharness "github.com/boxcar-run/boxcar/test/harness"
)

// brokenUpstream is a loopback server that fails each connection the way its row says.
type brokenUpstream func(t *testing.T, c net.Conn)

// readHead reads a request's header, so that the upstream fails after the request is in.
func readHead(c net.Conn) {
	br := bufio.NewReader(c)
	for {
		line, err := br.ReadString('\n')
		if err != nil || line == "\r\n" {
			return
		}
	}
}

var (
	closeBeforeAnswer brokenUpstream = func(_ *testing.T, c net.Conn) { readHead(c); c.Close() }
	resetBeforeAnswer brokenUpstream = func(_ *testing.T, c net.Conn) {
		readHead(c)
		if tc, ok := netConn(c).(*net.TCPConn); ok {
			_ = tc.SetLinger(0) // close sends RST
		}
		c.Close()
	}
	answerGarbage brokenUpstream = func(_ *testing.T, c net.Conn) {
		readHead(c)
		_, _ = io.WriteString(c, "SSH-2.0-OpenSSH_9.6\r\n\r\n")
		c.Close()
	}
	answerNothing brokenUpstream = func(_ *testing.T, c net.Conn) {
		readHead(c)
		_, _ = io.Copy(io.Discard, c) // until the proxy gives up and closes
		c.Close()
	}
	failHandshake brokenUpstream = func(_ *testing.T, c net.Conn) {
		_, _ = c.Read(make([]byte, 1)) // the ClientHello's first byte, then a close
		c.Close()
	}
)

// netConn is the TCP connection under a TLS one.
func netConn(c net.Conn) net.Conn {
	if tc, ok := c.(*tls.Conn); ok {
		return tc.NetConn()
	}
	return c
}

// serveBroken starts a loopback listener that hands each connection to fail, on TLS with a
// leaf for api.example.com when cert is set; it returns its address.
func serveBroken(t *testing.T, fail brokenUpstream, cert *tls.Certificate) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			if cert != nil {
				tc := tls.Server(c, &tls.Config{Certificates: []tls.Certificate{*cert}})
				if tc.Handshake() != nil {
					c.Close()
					continue
				}
				c = tc
			}
			go fail(t, c)
		}
	}()
	return ln.Addr().String()
}

// TestUpstreamFailureRecorded: a request that fails before the upstream answers is recorded
// as the failure it is, in its decision, the job's summary and the metrics, and the sandbox's
// client reads the same reason; before, a forwarded request whose upstream closed, reset or
// garbled its answer was recorded allowed.
func TestUpstreamFailureRecorded(t *testing.T) {
	tests := []struct {
		name   string
		url    string // through the proxy: plain forwarded, or a terminated tunnel to the bound host
		fail   brokenUpstream
		tls    bool // the upstream finishes TLS before it fails
		refuse bool // nothing listens
		want   Reason
		status int
	}{
		{"forwarded, dial refused", "http://plain.example.com/", nil, false, true, ReasonDial, http.StatusBadGateway},
		{"forwarded, closed before an answer", "http://plain.example.com/", closeBeforeAnswer, false, false, ReasonUpstreamClosed, http.StatusBadGateway},
		{"forwarded, reset before an answer", "http://plain.example.com/", resetBeforeAnswer, false, false, ReasonUpstreamClosed, http.StatusBadGateway},
		{"forwarded, an answer not HTTP", "http://plain.example.com/", answerGarbage, false, false, ReasonBadResponse, http.StatusBadGateway},
		{"forwarded, no answer in idle_timeout", "http://plain.example.com/", answerNothing, false, false, ReasonUpstreamTimeout, http.StatusGatewayTimeout},
		{"terminated, dial refused", "https://api.example.com/", nil, false, true, ReasonDial, http.StatusBadGateway},
		{"terminated, TLS handshake fails", "https://api.example.com/", failHandshake, false, false, ReasonUpstreamTLS, http.StatusBadGateway},
		{"terminated, closed before an answer", "https://api.example.com/", closeBeforeAnswer, true, false, ReasonUpstreamClosed, http.StatusBadGateway},
		{"terminated, reset before an answer", "https://api.example.com/", resetBeforeAnswer, true, false, ReasonUpstreamClosed, http.StatusBadGateway},
		{"terminated, an answer not HTTP", "https://api.example.com/", answerGarbage, true, false, ReasonBadResponse, http.StatusBadGateway},
		{"terminated, no answer in idle_timeout", "https://api.example.com/", answerNothing, true, false, ReasonUpstreamTimeout, http.StatusGatewayTimeout},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			caPEM, _, leaf := testUpstreamCert(t, "api.example.com")
			h := setup(t, func(c *Config) {
				c.UpstreamCAPEM = caPEM
				c.Limits.IdleTimeout = time.Second // how long answerNothing's upstream is waited for
			})
			to := testnet.ClosedAddr(t)
			if !tt.refuse {
				var cert *tls.Certificate
				if tt.tls {
					cert = &leaf
				}
				to = serveBroken(t, tt.fail, cert)
			}
			h.dialer.mu.Lock()
			h.dialer.routes[plainAddr+":80"], h.dialer.routes[apiAddr+":443"] = to, to
			h.dialer.mu.Unlock()

			req, _ := http.NewRequest(http.MethodGet, tt.url, nil)
			req.Header.Set("Authorization", "Bearer "+h.placeholder(t))
			resp, err := h.client(t).Do(req)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			if resp.StatusCode != tt.status || Reason(resp.Header.Get("X-Boxcar-Egress")) != tt.want {
				t.Errorf("the client read %d %q, want %d %s", resp.StatusCode, resp.Header.Get("X-Boxcar-Egress"), tt.status, tt.want)
			}
			d := h.waitDecision(t, "the request's", func(d Decision) bool { return d.Method == http.MethodGet })
			if d.Allowed || d.Reason != tt.want || !strings.Contains(d.Detail, "upstream") {
				t.Errorf("decision %+v, want not allowed, %s, with a detail on the upstream", d, tt.want)
			}
			if n := testutil.ToFloat64(h.proxy.cfg.Metrics.Decisions.WithLabelValues("denied", string(tt.want))); n != 1 {
				t.Errorf("boxcar_egress_decisions_total{denied,%s} = %v, want 1", tt.want, n)
			}
			if n := testutil.ToFloat64(h.proxy.cfg.Metrics.Decisions.WithLabelValues("allowed", string(ReasonAllowed))); n != 0 {
				t.Errorf("boxcar_egress_decisions_total{allowed,allowed} = %v, want 0", n)
			}
			if s := h.proxy.Summary(); s.Denied != 1 {
				t.Errorf("summary %+v, want the failed request denied", s)
			}
		})
	}
}

// TestClientBodyCutIsTheClients: a request body the sandbox stops sending is recorded as the
// sandbox's bad request, forwarded or inside a terminated tunnel, not as an upstream that
// closed: its reader keeps its error, which says which side failed.
func TestClientBodyCutIsTheClients(t *testing.T) {
	const post = "POST %s HTTP/1.1\r\nHost: %s\r\nContent-Length: 100\r\n\r\nten bytes."
	tests := []struct {
		name string
		open func(t *testing.T, h *harness) (io.Writer, func() error, *bufio.Reader)
		req  string
	}{
		{"forwarded", func(t *testing.T, h *harness) (io.Writer, func() error, *bufio.Reader) {
			c := h.dialProxy(t)
			return c, c.(*net.UnixConn).CloseWrite, bufio.NewReader(c)
		}, fmt.Sprintf(post, "http://plain.example.com/", "plain.example.com")},
		{"terminated", func(t *testing.T, h *harness) (io.Writer, func() error, *bufio.Reader) {
			tc, br := h.terminated(t, "api.example.com:443")
			return tc, tc.CloseWrite, br
		}, fmt.Sprintf(post, "/", "api.example.com")},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := setup(t, nil)
			w, closeWrite, br := tt.open(t, h)
			if _, err := io.WriteString(w, tt.req); err != nil {
				t.Fatal(err)
			}
			if err := closeWrite(); err != nil {
				t.Fatal(err)
			}
			status, got, d := h.answered(t, br, "the POST", withMethod(http.MethodPost))
			if got != ReasonBadRequest || d.Allowed || d.Reason != ReasonBadRequest {
				t.Fatalf("the client read %d %s, decision %+v; want bad_request for both", status, got, d)
			}
		})
	}
}

// readRecord reads one TLS record (a ClientHello, in a spliced tunnel), so that the upstream
// fails after the hello is in and leaves nothing unread (a close with unread bytes resets).
func readRecord(c net.Conn) {
	hdr := make([]byte, 5)
	if _, err := io.ReadFull(c, hdr); err != nil {
		return
	}
	_, _ = io.CopyN(io.Discard, c, int64(hdr[3])<<8|int64(hdr[4]))
}

// reset closes c with an RST, and no TLS close_notify before it.
func reset(c net.Conn) {
	raw := netConn(c)
	if tc, ok := raw.(*net.TCPConn); ok {
		_ = tc.SetLinger(0)
	}
	raw.Close()
}

// clientHelloFor is the first TLS record a client sends for sni, to write into a raw tunnel.
func clientHelloFor(t *testing.T, sni string) []byte {
	t.Helper()
	a, b := net.Pipe()
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = tls.Client(a, &tls.Config{ServerName: sni}).Handshake()
	}()
	hdr := make([]byte, 5)
	if _, err := io.ReadFull(b, hdr); err != nil {
		t.Fatal(err)
	}
	rec := make([]byte, int(hdr[3])<<8|int(hdr[4]))
	if _, err := io.ReadFull(b, rec); err != nil {
		t.Fatal(err)
	}
	a.Close()
	b.Close()
	<-done
	return append(hdr, rec...)
}

// TestSplicedTunnelFailureRecorded: a spliced tunnel whose upstream closes, resets or stays
// silent before it sends a byte back is recorded as that failure, as a forwarded request's is
// before its response: it was recorded allowed, in the metrics and the host's summary.
func TestSplicedTunnelFailureRecorded(t *testing.T) {
	tests := []struct {
		name string
		fail brokenUpstream
		want Reason
	}{
		{"closed before an answer", func(_ *testing.T, c net.Conn) { readRecord(c); c.Close() }, ReasonUpstreamClosed},
		{"reset before an answer", func(_ *testing.T, c net.Conn) { readRecord(c); reset(c) }, ReasonUpstreamClosed},
		{"no answer in idle_timeout", func(_ *testing.T, c net.Conn) {
			readRecord(c)
			_, _ = io.Copy(io.Discard, c)
			c.Close()
		}, ReasonUpstreamTimeout},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := setup(t, func(c *Config) { c.Limits.IdleTimeout = time.Second })
			to := serveBroken(t, tt.fail, nil)
			h.dialer.mu.Lock()
			h.dialer.routes[pkgAddr+":443"] = to
			h.dialer.mu.Unlock()
			c := h.connectOK(t, "pkg.example.com:443")
			if err := tls.Client(c, &tls.Config{ServerName: "pkg.example.com"}).Handshake(); err == nil {
				t.Fatal("the handshake went through")
			}
			d := h.waitDecision(t, "the tunnel's", func(d Decision) bool { return d.Method == http.MethodConnect })
			if d.Allowed || d.Reason != tt.want || !strings.Contains(d.Detail, "upstream") {
				t.Errorf("decision %+v, want not allowed, %s, with a detail on the upstream", d, tt.want)
			}
			if n := testutil.ToFloat64(h.proxy.cfg.Metrics.Decisions.WithLabelValues("denied", string(tt.want))); n != 1 {
				t.Errorf("boxcar_egress_decisions_total{denied,%s} = %v, want 1", tt.want, n)
			}
			if s := h.proxy.Summary(); s.Denied != 1 {
				t.Errorf("summary %+v, want the tunnel denied", s)
			}
		})
	}
}

// TestCutTransferSaysWhy: once the upstream has answered (a response header; a spliced
// tunnel's first byte back), a transfer the upstream then resets stays allowed, on every path
// alike, and its detail says the upstream reset it: the decision said nothing of the cut.
func TestCutTransferSaysWhy(t *testing.T) {
	const answer = "HTTP/1.1 200 OK\r\nContent-Length: 1000\r\n\r\n"
	tests := []struct {
		name    string
		method  string
		tls     bool                                     // the upstream is TLS (a terminated tunnel's)
		head    func(net.Conn)                           // what the upstream reads before it answers
		answer  string                                   // what it sends before the reset
		request func(t *testing.T, h *harness) io.Reader // sends the request, returns the answer's stream
	}{
		{"forwarded", http.MethodGet, false, readHead, answer + strings.Repeat("x", 100), func(t *testing.T, h *harness) io.Reader {
			c := h.dialProxy(t)
			sendRaw(getReq("http://plain.example.com/", "plain.example.com"))(t, c)
			return c
		}},
		{"terminated", http.MethodGet, true, readHead, answer + strings.Repeat("x", 100), func(t *testing.T, h *harness) io.Reader {
			tc, br := h.terminated(t, "api.example.com:443")
			sendRaw(getReq("/", "api.example.com"))(t, tc)
			return br
		}},
		{"spliced", http.MethodConnect, false, readRecord, strings.Repeat("x", 100), func(t *testing.T, h *harness) io.Reader {
			c := h.connectOK(t, "pkg.example.com:443")
			if _, err := c.Write(clientHelloFor(t, "pkg.example.com")); err != nil {
				t.Fatal(err)
			}
			return c
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			caPEM, _, leaf := testUpstreamCert(t, "api.example.com")
			h := setup(t, func(c *Config) { c.UpstreamCAPEM = caPEM })
			read := make(chan struct{}) // the client has read a byte of the answer
			var cert *tls.Certificate
			if tt.tls {
				cert = &leaf
			}
			to := serveBroken(t, func(_ *testing.T, c net.Conn) {
				tt.head(c)
				_, _ = io.WriteString(c, tt.answer)
				<-read
				reset(c)
			}, cert)
			h.dialer.mu.Lock()
			h.dialer.routes[plainAddr+":80"], h.dialer.routes[apiAddr+":443"], h.dialer.routes[pkgAddr+":443"] = to, to, to
			h.dialer.mu.Unlock()
			r := tt.request(t, h)
			if _, err := io.ReadFull(r, make([]byte, 1)); err != nil {
				t.Fatalf("no answer: %v", err)
			}
			close(read)
			_, _ = io.Copy(io.Discard, r)
			d := h.waitDecision(t, "the request's", func(d Decision) bool { return d.Method == tt.method })
			if !d.Allowed || !strings.Contains(d.Detail, "upstream reset") {
				t.Errorf("decision %+v, want allowed, with a detail saying the upstream reset it", d)
			}
		})
	}
}

// TestHostSummaryCountsWhatReachedIt: the bytes a request sent its host are in that host's
// summary (the signed manifest's list of hosts) however the request ended: an upload whose
// upstream closed before answering, a tunnel cut at the byte cap or whose upstream never
// answered was left out, as only allowed decisions were counted per host, and a job could
// send up to max_bytes to a host its manifest did not name. A request that never left the
// proxy (its dial failed) sent nothing: inside a terminated tunnel its header, taken from the
// byte cap before the dial, was counted as sent, and is given back.
func TestHostSummaryCountsWhatReachedIt(t *testing.T) {
	tests := []struct {
		name    string
		host    string
		fail    brokenUpstream // nil: the harness's own upstreams
		tweak   func(*Config)
		send    func(t *testing.T, h *harness)
		want    Reason
		reached bool // bytes reached the host
	}{
		{"an upload the upstream closed unanswered", "plain.example.com", closeBeforeAnswer, nil, func(t *testing.T, h *harness) {
			h.raw(t, "POST http://plain.example.com/ HTTP/1.1\r\nHost: plain.example.com\r\nContent-Length: 5\r\n\r\nhello")
		}, ReasonUpstreamClosed, true},
		{"a tunnel the upstream closed unanswered", "pkg.example.com", func(_ *testing.T, c net.Conn) { readRecord(c); c.Close() }, nil, func(t *testing.T, h *harness) {
			c := h.connectOK(t, "pkg.example.com:443")
			_ = tls.Client(c, &tls.Config{ServerName: "pkg.example.com"}).Handshake()
			c.Close()
		}, ReasonUpstreamClosed, true},
		{"a tunnel cut at the byte cap", "pkg.example.com", nil, func(c *Config) { c.Limits.MaxBytes = 4000 }, func(t *testing.T, h *harness) {
			try(t, h, "https://pkg.example.com/", strings.Repeat("A", 3000))
		}, ReasonByteCap, true},
		{"a request in a terminated tunnel whose dial failed", "api.example.com", nil, nil, func(t *testing.T, h *harness) {
			h.dialer.mu.Lock()
			h.dialer.routes[apiAddr+":443"] = testnet.ClosedAddr(t)
			h.dialer.mu.Unlock()
			get(t, h, "https://api.example.com/", h.placeholder(t))
		}, ReasonDial, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := setup(t, tt.tweak)
			if tt.fail != nil {
				to := serveBroken(t, tt.fail, nil)
				h.dialer.mu.Lock()
				h.dialer.routes[plainAddr+":80"], h.dialer.routes[pkgAddr+":443"] = to, to
				h.dialer.mu.Unlock()
			}
			tt.send(t, h)
			d := h.waitDecision(t, "the failure", func(d Decision) bool { return d.Reason == tt.want })
			s := h.proxy.Summary()
			i := slices.IndexFunc(s.Hosts, func(hs HostSummary) bool { return hs.Host == tt.host })
			switch {
			case tt.reached && (d.BytesOut == 0 || i < 0 || s.Hosts[i].BytesOut < d.BytesOut):
				t.Errorf("decision %+v, summary %+v: want %s with the bytes the request sent it", d, s, tt.host)
			case !tt.reached && (d.BytesOut != 0 || s.BytesOut != 0 || len(s.Secrets) != 0):
				t.Errorf("decision %+v, summary %+v: want nothing sent, no secret used", d, s)
			}
		})
	}
}

// TestUpstreamSwitchingProtocols: an upstream that answers 101 Switching Protocols, which the
// proxy does not carry (the request's Upgrade is never sent on), is bad_response on every path,
// and the sandbox reads 502: in a terminated tunnel the 101 went to the sandbox as an allowed
// answer, and the bytes the sandbox sent next were read as its next request.
func TestUpstreamSwitchingProtocols(t *testing.T) {
	for _, url := range []string{"http://plain.example.com/", "https://api.example.com/"} {
		t.Run(url, func(t *testing.T) {
			h, _ := countingUpstream(t, strings.HasPrefix(url, "https"), func(w http.ResponseWriter, _ *http.Request) {
				c, brw, err := http.NewResponseController(w).Hijack()
				if err != nil {
					return
				}
				defer c.Close()
				_, _ = brw.WriteString("HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n")
				_ = brw.Flush()
				_, _ = io.Copy(io.Discard, c) // the other protocol, until the proxy closes
			}, func(c *Config) { c.Limits.IdleTimeout = 2 * time.Second }) // how long a carried 101 lasted

			status, err := 0, error(nil)
			if resp, gerr := h.client(t).Get(url); gerr == nil {
				status = resp.StatusCode
				resp.Body.Close()
			} else {
				err = gerr
			}
			d := h.waitDecision(t, "the GET's", withMethod(http.MethodGet))
			if status != http.StatusBadGateway || d.Allowed || d.Reason != ReasonBadResponse {
				t.Errorf("the client read %d (%v); decision %+v; want 502 and bad_response", status, err, d)
			}
		})
	}
}

// TestJobEndRecorded: a request or tunnel still open when the job's proxy stops is recorded as
// cut by the job's end, on every path: a forwarded request or one in a terminated tunnel whose
// upstream had not answered was bad_response (an upstream whose answer is not HTTP), and a
// spliced tunnel was allowed with nothing said of its cut.
func TestJobEndRecorded(t *testing.T) {
	tests := []struct {
		name   string
		method string
		tls    bool
		fail   brokenUpstream // nil: the proxy never reaches the upstream, its stall hangs
		stall  string         // "dial" or "resolve": the step the job's end cuts short
		open   func(t *testing.T, h *harness)
	}{
		{"forwarded", http.MethodGet, false, answerNothing, "", func(t *testing.T, h *harness) {
			sendRaw(getReq("http://plain.example.com/", "plain.example.com"))(t, h.dialProxy(t))
		}},
		{"terminated", http.MethodGet, true, answerNothing, "", func(t *testing.T, h *harness) {
			tc, _ := h.terminated(t, "api.example.com:443")
			sendRaw(getReq("/", "api.example.com"))(t, tc)
		}},
		{"spliced", http.MethodConnect, false, func(_ *testing.T, c net.Conn) {
			readRecord(c)
			_, _ = io.Copy(io.Discard, c)
		}, "", func(t *testing.T, h *harness) {
			sendRaw(string(clientHelloFor(t, "pkg.example.com")))(t, h.connectOK(t, "pkg.example.com:443"))
		}},
		// The job ends while the proxy still dials or resolves: no upstream failed.
		{"spliced, dialling", http.MethodConnect, false, nil, "dial", func(t *testing.T, h *harness) {
			sendRaw(string(clientHelloFor(t, "pkg.example.com")))(t, h.connectOK(t, "pkg.example.com:443"))
		}},
		{"forwarded, dialling", http.MethodGet, false, nil, "dial", func(t *testing.T, h *harness) {
			sendRaw(getReq("http://plain.example.com/", "plain.example.com"))(t, h.dialProxy(t))
		}},
		{"terminated, dialling", http.MethodGet, true, nil, "dial", func(t *testing.T, h *harness) {
			tc, _ := h.terminated(t, "api.example.com:443")
			sendRaw(getReq("/", "api.example.com"))(t, tc)
		}},
		{"forwarded, resolving", http.MethodGet, false, nil, "resolve", func(t *testing.T, h *harness) {
			sendRaw(getReq("http://plain.example.com/", "plain.example.com"))(t, h.dialProxy(t))
		}},
		// The job ends while the proxy reads a form's body for its _method on its way upstream
		// (formBody), the sandbox having sent part of it after the proxy's 100 Continue.
		{"forwarded, sending a form", http.MethodPost, false, answerNothing, "", func(t *testing.T, h *harness) {
			c := h.dialProxy(t)
			sendRaw("POST http://plain.example.com/ HTTP/1.1\r\nHost: plain.example.com\r\n"+halfForm)(t, c)
			awaitContinue(t, bufio.NewReader(c))
		}},
		{"terminated, sending a form", http.MethodPost, true, answerNothing, "", func(t *testing.T, h *harness) {
			tc, br := h.terminated(t, "api.example.com:443")
			sendRaw("POST / HTTP/1.1\r\nHost: api.example.com\r\n"+halfForm)(t, tc)
			awaitContinue(t, br)
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			caPEM, _, leaf := testUpstreamCert(t, "api.example.com")
			h := setup(t, func(c *Config) { c.UpstreamCAPEM = caPEM })
			var cert *tls.Certificate
			if tt.tls {
				cert = &leaf
			}
			reached := make(chan struct{}, 1)
			to := serveBroken(t, func(t *testing.T, c net.Conn) {
				reached <- struct{}{}
				tt.fail(t, c)
			}, cert)
			h.dialer.mu.Lock()
			h.dialer.routes[plainAddr+":80"], h.dialer.routes[apiAddr+":443"], h.dialer.routes[pkgAddr+":443"] = to, to, to
			if tt.stall == "dial" {
				h.dialer.hang = reached
			}
			h.dialer.mu.Unlock()
			if tt.stall == "resolve" {
				h.resolver.mu.Lock()
				h.resolver.hang = reached
				h.resolver.mu.Unlock()
			}
			tt.open(t, h)
			<-reached
			if err := h.stop(); err != nil {
				t.Fatal(err)
			}
			d := h.waitDecision(t, "the request's", withMethod(tt.method))
			if d.Allowed || d.Reason != ReasonJobEnded {
				t.Errorf("decision %+v, want job_ended", d)
			}
		})
	}
}

// halfForm is the rest of a form POST's header asking for a 100 Continue, and half its body.
const halfForm = "Content-Type: application/x-www-form-urlencoded\r\nContent-Length: 20\r\nExpect: 100-continue\r\n\r\na=1&b="

// awaitContinue reads the proxy's 100 Continue from br, and sends nothing: the proxy then
// reads the body the sandbox has yet to send.
func awaitContinue(t *testing.T, br *bufio.Reader) {
	t.Helper()
	line, err := br.ReadString('\n')
	if err != nil || !strings.HasPrefix(line, "HTTP/1.1 100 ") {
		t.Fatalf("read %q (%v), want the proxy's 100 Continue", line, err)
	}
}

// heldResolver holds each lookup of a request's host (fully qualified, as the proxy asks it;
// not the worker endpoints New resolves) until release is closed, after a send on reached:
// the sandbox can act while the proxy checks its request.
type heldResolver struct {
	Resolver
	reached chan<- struct{}
	release <-chan struct{}
}

func (r heldResolver) LookupNetIP(ctx context.Context, network, name string) ([]netip.Addr, error) {
	if strings.HasSuffix(name, ".") {
		signal(r.reached)
		<-r.release
	}
	return r.Resolver.LookupNetIP(ctx, network, name)
}

// TestSandboxGoneBeforeTheProxyAnswers: a sandbox that closes its connection while the proxy
// checks its request, before the proxy's own first words to it (a CONNECT's 200, the 100
// Continue it answers for the upstream), has the request decided all the same, and what
// max_requests counted is in the job's requests: such a CONNECT had no decision, though it
// counted against max_requests (the job's requests 0, the cap's count 1).
func TestSandboxGoneBeforeTheProxyAnswers(t *testing.T) {
	tests := []struct {
		name, method, request, detail string
	}{
		{"CONNECT", http.MethodConnect, connectReq("pkg.example.com:443"), "before the proxy's 200 reached it"},
		{"forwarded, Expect: 100-continue", http.MethodPost, "POST http://plain.example.com/ HTTP/1.1\r\nHost: plain.example.com\r\n" +
			"Content-Length: 5\r\nExpect: 100-continue\r\n\r\n", "before the upstream answered"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			reached, release := make(chan struct{}, 1), make(chan struct{})
			h := setup(t, func(c *Config) { c.Resolver = heldResolver{c.Resolver, reached, release} })
			c := h.dialProxy(t)
			if _, err := io.WriteString(c, tt.request); err != nil {
				t.Fatal(err)
			}
			<-reached
			c.Close() // a unix socket: the proxy's next write to it fails
			close(release)
			testharness.Wait(t, "the proxy done with the connection", func() (bool, error) {
				return h.proxy.tunnels.Load() == 0, nil
			})
			all := h.all()
			if len(all) != 1 || all[0].Method != tt.method || all[0].Allowed || all[0].Reason != ReasonBadRequest ||
				!strings.Contains(all[0].Detail, "sandbox closed") || !strings.Contains(all[0].Detail, tt.detail) {
				t.Errorf("decisions %+v; want one, %s, bad_request, its detail saying the sandbox closed %s", all, tt.method, tt.detail)
			}
			if got, counted := h.proxy.Summary().Requests, h.proxy.reqs.Load(); got != counted {
				t.Errorf("the job's requests are %d, max_requests counted %d; want the same", got, counted)
			}
		})
	}
}
