package egress

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptrace"
	"net/netip"
	"net/url"
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// The upstream side of terminated tunnels is one http.Transport per Proxy: connections to a
// secret-bound host are kept alive across the sandbox's connections (pip, git and curl open a new
// one per file), so a request pays one TLS handshake, the sandbox's with the proxy, rather than
// two; the Transport also drops pooled connections the server has closed before reusing them.

// tunnelKey carries a request's tunnel, and so its checked address, to dialChecked.
type tunnelKey struct{}

// errUpstreamTLS marks an upstream whose certificate did not verify.
var errUpstreamTLS = errors.New("egress: upstream TLS")

func (p *Proxy) newTransport() *http.Transport {
	return &http.Transport{
		DialTLSContext:      p.dialChecked,
		DisableCompression:  true, // pass the body as the upstream sent it
		MaxIdleConnsPerHost: 4,
		// In all, as many idle as the job may have tunnels: per host alone, a job cycling
		// through the ports or names a secret is bound to would leave one behind per tunnel.
		MaxIdleConns:           p.cfg.Limits.MaxTunnels,
		IdleConnTimeout:        90 * time.Second,
		ResponseHeaderTimeout:  p.cfg.Limits.IdleTimeout,
		MaxResponseHeaderBytes: maxResponseHeaderBytes,
		// HTTP/1.1 only: a non-nil empty map turns HTTP/2 off.
		TLSNextProto: map[string]func(string, *tls.Conn) http.RoundTripper{},
	}
}

// dialChecked opens a connection for the Transport: the tunnel's checked address, TLS verified
// for the tunnel's host against the host's roots and Config.UpstreamCAPEM.
func (p *Proxy) dialChecked(ctx context.Context, _, _ string) (_ net.Conn, err error) {
	defer p.recovered("upstream dial", &err) // the Transport's goroutine
	t, ok := ctx.Value(tunnelKey{}).(*tunnel)
	if !ok {
		return nil, errors.New("egress: a request without a checked address")
	}
	raw, v := p.dial(ctx, t.addr)
	switch {
	case v != nil && v.reason == ReasonJobEnded:
		// ctx is the request's: its cause says why it ended (the job's end, the byte cap).
		return nil, context.Cause(ctx)
	case v != nil:
		return nil, fmt.Errorf("%w %s: %s", errDial, t.addr, v.detail)
	}
	up := tls.Client(&idleConn{Conn: raw, idle: p.cfg.Limits.IdleTimeout}, p.upstreamTLS(t.h.String()))
	hctx, cancel := context.WithTimeout(ctx, p.cfg.Limits.DialTimeout)
	defer cancel()
	if err := up.HandshakeContext(hctx); err != nil {
		raw.Close()
		return nil, fmt.Errorf("%w: %s: %v", errUpstreamTLS, t.h, err)
	}
	return &upConn{Conn: up, p: p, addr: t.addr}, nil
}

// upConn is a connection to a bound host above its TLS, where the Transport writes requests:
// each write is counted, and capped, by the request the Transport has given the connection to
// (its GotConn), so what is counted is what went on the wire, on every connection a request
// was tried on. The Transport sends a request it may replay (no body: GET, HEAD, OPTIONS, or
// any method with an Idempotency-Key) again on a new connection when a host closes a kept-alive
// one before a byte of its answer: counted once, where the header was counted as it was
// built, such a request reached the host twice, real secret and all, and one of them in no
// decision, the byte cap nor the host's summary.
type upConn struct {
	net.Conn
	p    *Proxy
	addr netip.AddrPort // the checked address it was dialled to, for an earlier tunnel maybe
	mu   sync.Mutex
	by   *sending // the request the connection carries now
}

func (c *upConn) carry(s *sending) {
	c.mu.Lock()
	c.by = s
	c.mu.Unlock()
}

// Read is the Transport's read loop's, on a goroutine of its own.
func (c *upConn) Read(b []byte) (n int, err error) {
	defer c.p.recovered("upstream read", &err)
	return c.Conn.Read(b)
}

// Write is the Transport's write loop's, on a goroutine of its own.
func (c *upConn) Write(b []byte) (n int, err error) {
	defer c.p.recovered("upstream write", &err)
	c.mu.Lock()
	s := c.by
	c.mu.Unlock()
	if s == nil {
		return 0, errors.New("egress: a write upstream for no request")
	}
	return s.write(c.Conn, b)
}

// errRequestEnded refuses what the Transport would still write of a request once its decision
// is settled: an upload the upstream answered before it had it whole, whose tunnel ends.
var errRequestEnded = errors.New("egress: the request's decision is settled")

// sending is one request's way to its bound host: what each attempt wrote, counted in out.
// Each attempt's header is taken from the job's byte cap whole before it is written (header
// bytes), or the attempt writes nothing and the request fails at the cap (errByteCap); an
// attempt after one that sent a byte is a request more, taken from max_requests (again) as
// its header is, or it writes nothing and the request fails at that cap (errRequestCap).
type sending struct {
	out    *meter
	header int
	cancel context.CancelCauseFunc // the request's context: no attempt after a refused one
	again  func() bool             // takes a request from the job's cap for a replay

	mu       sync.Mutex
	credit   int   // taken from the cap for headers, not yet written
	attempts int   // connections the Transport gave the request
	sent     int   // attempts that wrote a byte
	wrote    bool  // the current attempt wrote a byte
	replays  int   // requests taken from max_requests for attempts after the first
	refused  error // the cap the last attempt did not fit under
	ended    bool
	// to is the address of the connection the last attempt went on: a pooled one was dialled
	// for an earlier tunnel, whose host resolved to another of its addresses maybe.
	to netip.AddrPort
}

// reserve makes room for one attempt's header, whole: what an attempt that wrote nothing (a
// pooled connection found closed) left of its room, and from the job's byte cap what it lacks.
func (s *sending) reserve() error {
	need := s.header - s.credit
	if need <= 0 {
		return nil
	}
	if got := s.out.take(need); got < need {
		s.out.settle(got, 0)
		return errByteCap
	}
	s.credit += need // taken from the cap, counted in the decision once written
	return nil
}

// attempt is the Transport's GotConn: c carries the request now. The first attempt's header
// was reserved before the dial (outbound); each next one's is reserved here.
func (s *sending) attempt(c net.Conn) {
	s.mu.Lock()
	s.attempts++
	s.wrote = false
	switch {
	case s.attempts > 1 && s.reserve() != nil:
		s.refuse(errByteCap)
	case s.sent > s.replays: // an earlier attempt sent a byte: this one is the request again
		s.replays++
		if !s.again() {
			s.refuse(errRequestCap)
		}
	}
	uc, ok := c.(*upConn)
	if ok {
		s.to = uc.addr
	}
	s.mu.Unlock()
	if ok {
		uc.carry(s)
	}
}

// write writes b to w as far as the header's reservation and the job's byte cap let it,
// counting what was written. The lock is held through the write so that end counts every
// write begun before it.
func (s *sending) write(w io.Writer, b []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	switch {
	case s.ended:
		return 0, errRequestEnded
	case s.refused != nil:
		return 0, s.refused
	}
	fromCredit := min(s.credit, len(b))
	s.credit -= fromCredit
	k := fromCredit + s.out.take(len(b)-fromCredit)
	var n int
	var err error
	if k > 0 {
		n, err = w.Write(b[:k])
	}
	s.out.settle(k, n)
	if n > 0 && !s.wrote {
		s.wrote = true
		s.sent++
	}
	if err == nil && k < len(b) {
		err = errByteCap
	}
	return n, err
}

// refuse ends the request's attempts at the cap err names. s.mu is held.
func (s *sending) refuse(err error) {
	s.refused = err
	s.cancel(err)
}

// addr is the address of the connection the request's last attempt went on, if it got one.
func (s *sending) addr() netip.AddrPort {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.to
}

// cause is why the request failed with err: the cap that refused its last attempt, when one
// did. The Transport returns either the refused write's error or, when it sees the request's
// context cancelled first, a bare cancellation, which would read as the upstream's failure
// (TestRetriedRequestCounted's cap rows, under load).
func (s *sending) cause(err error) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.refused != nil {
		return s.refused
	}
	return err
}

// end closes the request to further writes, gives back the header bytes it reserved and did
// not write, and records in d how many times it was sent (a byte of it or more, said only
// when more than once) and the address of the connection it last went on, when it got one.
func (s *sending) end(d *Decision) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.ended {
		s.ended = true
		s.out.job.Add(-int64(s.credit))
		s.credit = 0
		s.cancel(errRequestEnded)
	}
	if d.Sent = s.sent; s.sent < 2 {
		d.Sent = 0
	}
	if s.to.IsValid() {
		d.Addr = s.to.String()
	}
}

// outbound is the request sent upstream for one request read inside a tunnel: same method,
// path and (swapped) header fields, the tunnel's host as its Host (hostField), the body streamed from the sandbox. Its header is
// taken from the job's byte cap whole before anything is dialled, or the request is not sent
// (errByteCap); every byte the Transport writes of it, on every attempt, is counted in out
// (upConn). The caller ends s once the request is through.
func outbound(ctx context.Context, t *tunnel, req *http.Request, out *meter, body *meteredBody, again func() bool) (*http.Request, *sending, error) {
	ctx, cancel := context.WithCancelCause(context.WithValue(ctx, tunnelKey{}, t))
	s := &sending{out: out, cancel: cancel, again: again}
	ctx = httptrace.WithClientTrace(ctx, &httptrace.ClientTrace{GotConn: func(i httptrace.GotConnInfo) { s.attempt(i.Conn) }})
	o := req.Clone(ctx)
	// Only the checked host and the path go upstream, never a target as the sandbox spelled
	// it: whatever would make the upstream read another host (an opaque or absolute-form
	// target, userinfo) is dropped here even if a check upstream of this one misses it.
	o.URL = &url.URL{Scheme: "https", Host: t.authority(), Path: req.URL.Path, RawPath: req.URL.RawPath,
		RawQuery: req.URL.RawQuery, ForceQuery: req.URL.ForceQuery}
	o.RequestURI = ""
	o.Host = t.h.hostField(t.port, 443)
	o.Close = false
	// The sandbox's trailers are not sent on, and neither is the Trailer field that announces
	// them, which the Transport writes from the map's keys: their names are the sandbox's to
	// choose, up to max_header_bytes a request.
	o.Trailer = nil
	if _, ok := o.Header["User-Agent"]; !ok {
		o.Header["User-Agent"] = nil // the Transport adds its own otherwise
	}
	hasBody := req.ContentLength != 0 || len(req.TransferEncoding) > 0
	if hasBody {
		body.ReadCloser = req.Body
		o.Body = body
	} else {
		body.done.Store(true)
		o.Body = http.NoBody // an unknown body would make the Transport probe it
	}
	s.header = headerSize(o, hasBody)
	if err := s.reserve(); err != nil {
		s.end(&Decision{})
		return nil, nil, fmt.Errorf("request header for %s: %w", t.h, err)
	}
	return o, s, nil
}

// headerSize is what the Transport writes of o's header: request line, Host (the URL's when
// the request has none, as an HTTP/1.0 one may), fields, a body's framing field (counted at
// its longest, Content-Length of 19 digits; net/http sends "Content-Length: 0" for a POST,
// PUT or PATCH without a body too) and the blank line.
func headerSize(o *http.Request, hasBody bool) int {
	var fields countingWriter
	_ = o.Header.Write(&fields)
	hostField := o.Host
	if hostField == "" {
		hostField = o.URL.Host
	}
	n := len(o.Method) + len(" ") + len(o.URL.RequestURI()) + len(" HTTP/1.1\r\nHost: \r\n") + len(hostField) +
		int(fields) + len("\r\n")
	if hasBody || slices.Contains([]string{http.MethodPost, http.MethodPut, http.MethodPatch}, o.Method) {
		n += len("Content-Length: 9223372036854775807\r\n")
	}
	return n
}

// meteredBody is a request body as the Transport reads it from the sandbox: it says when it
// was read whole, for the body is read from the sandbox's connection, which nothing else may
// read until then, and marks the sandbox's failures (errClientBody). Its bytes, and the
// framing of a chunked one, are counted as they are written upstream (upConn).
type meteredBody struct {
	io.ReadCloser
	p       *Proxy
	done    atomic.Bool // the body was read to its end
	stopped atomic.Bool // stop: no read more
	reading atomic.Int32
	refused atomic.Pointer[formRefusal] // the form's refusal, where a read found one
}

// errBodyStopped ends the Transport's read of a request body after its answer (stop).
var errBodyStopped = errors.New("egress: the request's answer is through; the rest of its body is not sent")

// Read is the Transport's write loop's, on a goroutine of its own.
func (b *meteredBody) Read(p []byte) (n int, err error) {
	defer b.p.recovered("request body's read", &err)
	b.reading.Add(1)
	defer b.reading.Add(-1)
	if b.stopped.Load() {
		return 0, errBodyStopped
	}
	n, err = b.ReadCloser.Read(p)
	var fr *formRefusal
	switch {
	case errors.Is(err, io.EOF):
		b.done.Store(true)
	case errors.As(err, &fr):
		b.refused.Store(fr)
	case err != nil:
		err = fmt.Errorf("%w: %w", errClientBody, err)
	}
	return n, err
}

// stop ends the read of a body the Transport may go on sending after the upstream's answer,
// and returns the form's refusal if a read found one. A read under way is waited for, cut by
// a read deadline on c, the sandbox's connection, which ends with the request; a refusal found
// as the answer went to the sandbox, the decision settled, went unrecorded
// (TestFormOverrideAfterTheAnswerIsMethod).
func (b *meteredBody) stop(c net.Conn) *formRefusal {
	b.stopped.Store(true)
	for end := time.Now().Add(lingerTimeout); b.reading.Load() > 0 && !b.done.Load() && time.Now().Before(end); {
		_ = c.SetReadDeadline(time.Unix(1, 0)) // again: each read of the connection sets its own
		time.Sleep(10 * time.Millisecond)
	}
	return b.refused.Load()
}

type countingWriter int

func (c *countingWriter) Write(p []byte) (int, error) {
	*c += countingWriter(len(p))
	return len(p), nil
}
