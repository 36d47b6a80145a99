package egress

import (
	"bufio"
	"bytes"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
)

// TestChunkFramingCounted: a chunked upload inside a terminated tunnel is sent on by the
// Transport as chunks of its own, one for each read of the body, and the sandbox decides how
// much each read gets: a chunk at a time, a byte each, put 5 bytes of framing ("1\r\nX\r\n")
// upstream for every byte the job's cap counted. Every byte the upstream reads of the request
// is counted, and no more: the decision's bytes_out is what reached it.
func TestChunkFramingCounted(t *testing.T) {
	const chunks = 200
	got := make(chan struct{})
	h, up := countingUpstream(t, true, func(w http.ResponseWriter, r *http.Request) {
		one := make([]byte, 1)
		for {
			if _, err := io.ReadFull(r.Body, one); err != nil {
				break
			}
			got <- struct{}{}
		}
		_, _ = io.WriteString(w, "ok")
	})
	tc, br := h.terminated(t, "api.example.com:443")
	if _, err := io.WriteString(tc, "POST /up HTTP/1.1\r\nHost: api.example.com\r\nTransfer-Encoding: chunked\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	for range chunks {
		// Each chunk once the upstream has the one before: the proxy reads it alone.
		if _, err := io.WriteString(tc, "1\r\nX\r\n"); err != nil {
			t.Fatal(err)
		}
		<-got
	}
	if _, err := io.WriteString(tc, "0\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	_, _, d := h.answered(t, br, "the upload", withMethod(http.MethodPost))
	if read := up.read.Load(); d.BytesOut != read {
		t.Errorf("the decision counts %d bytes out; the upstream read %d of the request (%d of them its body)", d.BytesOut, read, chunks)
	}
}

// countingUpstream is a harness whose bound host (api.example.com:443, on TLS when
// terminated) and plain.example.com:80 are served by handler on a countingListener.
func countingUpstream(t *testing.T, terminated bool, handler http.HandlerFunc, tweaks ...func(*Config)) (*harness, *countingListener) {
	t.Helper()
	caPEM, _, leaf := testUpstreamCert(t, "api.example.com")
	up := &countingListener{Listener: listenLoopback(t)}
	if terminated {
		up.cfg = &tls.Config{Certificates: []tls.Certificate{leaf}}
	}
	srv := &http.Server{Handler: handler}
	go func() { _ = srv.Serve(up) }()
	t.Cleanup(func() { srv.Close() })
	h := setup(t, func(c *Config) {
		c.UpstreamCAPEM = caPEM
		for _, tweak := range tweaks {
			tweak(c)
		}
	})
	h.dialer.mu.Lock()
	h.dialer.routes[apiAddr+":443"], h.dialer.routes[plainAddr+":80"] = up.Addr().String(), up.Addr().String()
	h.dialer.mu.Unlock()
	return h, up
}

func listenLoopback(t *testing.T) net.Listener {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	return ln
}

// countingListener terminates TLS itself (when it has a cfg) and counts the plain bytes read on its connections:
// what the proxy's Transport wrote.
type countingListener struct {
	net.Listener
	cfg  *tls.Config
	read atomic.Int64
}

func (l *countingListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	if l.cfg != nil {
		c = tls.Server(c, l.cfg)
	}
	return &countingConn{Conn: c, n: &l.read}, nil
}

type countingConn struct {
	net.Conn
	n *atomic.Int64
}

func (c *countingConn) Read(b []byte) (int, error) {
	n, err := c.Conn.Read(b)
	c.n.Add(int64(n))
	return n, err
}

// TestUpstreamReadsOnlyWhatIsCounted: whatever shape a request takes, the decision's bytes_out
// is at least what its upstream read of it, forwarded or inside a terminated tunnel.
func TestUpstreamReadsOnlyWhatIsCounted(t *testing.T) {
	big := strings.Repeat("A", 8<<10)
	tests := []struct {
		name string
		req  string // %s is the target: an absolute http:// URL forwarded, a path in the tunnel
		host string
	}{
		{"chunked with an announced trailer", "POST %s HTTP/1.1\r\nHost: %s\r\nTrailer: X-T\r\nTransfer-Encoding: chunked\r\n\r\n1\r\nX\r\n0\r\nX-T: " + big + "\r\n\r\n", ""},
		{"chunked with a trailer not announced", "POST %s HTTP/1.1\r\nHost: %s\r\nTransfer-Encoding: chunked\r\n\r\n1\r\nX\r\n0\r\nX-T: " + big + "\r\n\r\n", ""},
		{"trailer names announced and none sent", "POST %s HTTP/1.1\r\nHost: %s\r\nTrailer: " + strings.Repeat("X-Name-", 2<<10) + "\r\nTransfer-Encoding: chunked\r\n\r\n1\r\nX\r\n0\r\n\r\n", ""},
		{"HTTP/1.0 without Host", "GET %s HTTP/1.0\r\n%s\r\n", ""},
		{"POST without a body", "POST %s HTTP/1.1\r\nHost: %s\r\n\r\n", ""},
		{"PUT with a zero length", "PUT %s HTTP/1.1\r\nHost: %s\r\nContent-Length: 0\r\n\r\n", ""},
		{"Expect: 100-continue", "POST %s HTTP/1.1\r\nHost: %s\r\nExpect: 100-continue\r\nContent-Length: 1\r\n\r\nX", ""},
	}
	for _, path := range []string{"forwarded", "terminated"} {
		for _, tt := range tests {
			t.Run(path+" "+tt.name, func(t *testing.T) {
				h, up := countingUpstream(t, path == "terminated", func(w http.ResponseWriter, r *http.Request) {
					_, _ = io.Copy(io.Discard, r.Body)
					_, _ = io.WriteString(w, "ok")
				})
				var w io.Writer
				var br *bufio.Reader
				target, host := "/up", "api.example.com"
				if path == "forwarded" {
					c := h.dialProxy(t)
					w, br, target, host = c, bufio.NewReader(c), "http://plain.example.com/up", "plain.example.com"
				} else {
					tc, tbr := h.terminated(t, "api.example.com:443")
					w, br = tc, tbr
				}
				req := fmt.Sprintf(tt.req, target, host)
				if strings.Contains(tt.name, "without Host") {
					req = fmt.Sprintf(tt.req, target, "")
				}
				if _, err := io.WriteString(w, req); err != nil {
					t.Fatal(err)
				}
				_, _, d := h.answered(t, br, "the request", notConnect)
				if read := up.read.Load(); d.BytesOut < read {
					t.Errorf("decision %+v counts %d bytes out; the upstream read %d", d, d.BytesOut, read)
				}
			})
		}
	}
}

// TestRetriedRequestCounted: a bound host that closes a kept-alive connection after it read a
// request, before a byte of its answer, has net/http's Transport send a request it may replay
// (no body: GET, or a POST with an Idempotency-Key) again on a new connection. The request,
// real secret and all, reached the host twice and the decision counted it once: every byte
// the upstream reads is counted, on every attempt, and the decision says it was sent twice.
// A retry is taken from the byte cap as a new request's header is, whole or not at all, and
// from max_requests as a new request is, and the job's summary counts it (the host's requests
// there were one fewer than the host got, and a job at max_requests had one more sent).
func TestRetriedRequestCounted(t *testing.T) {
	const pad = 4000
	tests := []struct {
		name     string
		req      string // the second request on the tunnel, the one the host drops once
		maxBytes int64  // room for the first attempt, not for a second
		maxReqs  int64  // room for the CONNECT and two requests, not for a replay
		status   int
		detail   string // the second request's decision's
	}{
		{"GET", "GET /again HTTP/1.1\r\nHost: api.example.com\r\nAuthorization: Bearer %s\r\n\r\n", 0, 0, http.StatusOK, "sent 2 times"},
		{"POST with an Idempotency-Key", "POST /again HTTP/1.1\r\nHost: api.example.com\r\nIdempotency-Key: k1\r\nAuthorization: Bearer %s\r\n\r\n", 0, 0, http.StatusOK, "sent 2 times"},
		{"GET at the byte cap", "GET /again HTTP/1.1\r\nHost: api.example.com\r\nAuthorization: Bearer %s\r\nX-Pad: " + strings.Repeat("p", pad) + "\r\n\r\n",
			capReserve + 1000 + pad*3/2, 0, http.StatusTooManyRequests, "byte cap"},
		{"GET at the request cap", "GET /again HTTP/1.1\r\nHost: api.example.com\r\nAuthorization: Bearer %s\r\n\r\n", 0, 3, http.StatusTooManyRequests, "request cap"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var dropped atomic.Bool
			var got atomic.Int64 // requests the host read
			h, up := countingUpstream(t, true, func(w http.ResponseWriter, r *http.Request) {
				got.Add(1)
				if r.URL.Path == "/again" && dropped.CompareAndSwap(false, true) {
					c, _, err := http.NewResponseController(w).Hijack()
					if err == nil {
						c.Close() // read, unanswered, on the connection the Transport kept alive
					}
					return
				}
				_, _ = io.WriteString(w, "ok")
			}, func(c *Config) { c.Limits.MaxBytes, c.Limits.MaxRequests = tt.maxBytes, tt.maxReqs })
			tc, br := h.terminated(t, "api.example.com:443")
			var d Decision
			for i, req := range []string{"GET /first HTTP/1.1\r\nHost: api.example.com\r\n\r\n", fmt.Sprintf(tt.req, h.placeholder(t))} {
				if _, err := io.WriteString(tc, req); err != nil {
					t.Fatal(err)
				}
				var status int
				// The second request carries the secret, the first none.
				status, _, d = h.answered(t, br, "a request", func(d Decision) bool { return notConnect(d) && len(d.Secrets) == i })
				if want := []int{http.StatusOK, tt.status}[i]; status != want {
					t.Fatalf("request %d: status %d, want %d", i, status, want)
				}
			}
			if !dropped.Load() || !strings.Contains(d.Detail, tt.detail) {
				t.Errorf("the host dropped a connection: %v; the dropped request's decision %+v, want a detail with %q", dropped.Load(), d, tt.detail)
			}
			var counted int64
			for _, d := range h.all() {
				counted += d.BytesOut
			}
			if read := up.read.Load(); counted != read {
				t.Errorf("the decisions count %d bytes out; the upstream read %d (%+v)", counted, read, h.all())
			}
			// What was taken from the cap for a header and not sent is given back.
			s := h.proxy.Summary()
			if used := h.proxy.bytes.Load(); used != s.BytesOut+s.BytesIn+s.Lingered {
				t.Errorf("the job's cap has %d bytes used; its decisions moved %d, its lingers read %d", used, s.BytesOut+s.BytesIn, s.Lingered)
			}
			// Every request the host read is one of the job's, in its summary and its cap.
			if len(s.Hosts) != 1 || s.Hosts[0].Requests != got.Load() || s.Requests != got.Load()+1 {
				t.Errorf("the host read %d requests; the summary counts %d in all and %+v", got.Load(), s.Requests, s.Hosts)
			}
			if tt.maxReqs > 0 && got.Load()+1 > tt.maxReqs {
				t.Errorf("max_requests %d: the host read %d requests in the job's one tunnel", tt.maxReqs, got.Load())
			}
		})
	}
}

// TestUploadCutAfterAnswer: an upload inside a terminated tunnel that the byte cap cuts after
// the bound host began its answer is byte_cap, as docs/egress.md says a transfer cut at the
// cap is either way, and counts what reached the host; the answer flows until then. The
// body's reads took what was left of the cap before each read and held it while the read
// waited for the sandbox: the answer, written meanwhile, found no room, and the sandbox read
// nothing of it (decision byte_cap at 1,132 bytes out of a 20,000-byte cap, 0 bytes in).
// Bytes are taken from the cap as they are written, with the bytes in hand.
func TestUploadCutAfterAnswer(t *testing.T) {
	const first, size = 1000, 100_000
	h, up := countingUpstream(t, true, func(w http.ResponseWriter, r *http.Request) {
		_ = http.NewResponseController(w).EnableFullDuplex()
		if _, err := io.ReadFull(r.Body, make([]byte, first)); err != nil {
			return
		}
		// An answer begun before the body is in, longer than the scrubber holds back.
		_, _ = io.WriteString(w, "ack\n"+strings.Repeat("-", 100))
		_ = http.NewResponseController(w).Flush()
		_, _ = io.Copy(io.Discard, r.Body)
		_, _ = io.WriteString(w, "done\n")
	}, func(c *Config) { c.Limits.MaxBytes = 20_000 })
	tc, br := h.terminated(t, "api.example.com:443")
	head := fmt.Sprintf("POST /up HTTP/1.1\r\nHost: api.example.com\r\nContent-Length: %d\r\n\r\n", size)
	if _, err := io.WriteString(tc, head+strings.Repeat("a", first)); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if _, err := io.ReadFull(resp.Body, make([]byte, len("ack\n"))); err != nil {
		t.Fatalf("the answer's first line: %v", err)
	}
	go func() { _, _ = io.WriteString(tc, strings.Repeat("b", size-first)) }() // past the cap
	_, _ = io.Copy(io.Discard, resp.Body)
	d := h.waitDecision(t, "the upload", withMethod(http.MethodPost))
	if d.Allowed || d.Reason != ReasonByteCap {
		t.Errorf("decision %+v, want byte_cap", d)
	}
	if read := up.read.Load(); d.BytesOut < read {
		t.Errorf("the decision counts %d bytes out; the upstream read %d", d.BytesOut, read)
	}
}

// TestRetryKeepsTheRoomOfAnUnsentAttempt: an attempt that wrote nothing (a pooled connection
// the host had closed, found closed at the write) leaves its header's room to the next, which
// takes from the byte cap only what it lacks: it took a whole header more, and near the cap
// the request was refused byte_cap though no byte of it had moved.
func TestRetryKeepsTheRoomOfAnUnsentAttempt(t *testing.T) {
	const header = 100
	var job atomic.Int64
	s := &sending{out: &meter{job: &job, cap: header + header/2}, header: header, cancel: func(error) {}}
	if err := s.reserve(); err != nil {
		t.Fatal(err)
	}
	s.attempt(nil) // the first connection: nothing written on it
	s.attempt(nil) // the retry
	var up bytes.Buffer
	if n, err := s.write(&up, make([]byte, header)); n != header || err != nil {
		t.Fatalf("the retry's header: %d bytes written, %v", n, err)
	}
	if s.end(&Decision{}); job.Load() != header || s.out.n.Load() != header {
		t.Errorf("the job has %d bytes used, the request %d; want %d, one header", job.Load(), s.out.n.Load(), header)
	}
}
