package egress

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"slices"
	"syscall"
	"time"
)

// statusOf is the HTTP status a refusal answers with, when the client can still read one.
var statusOf = map[Reason]int{
	ReasonNotAllowed:      http.StatusForbidden,
	ReasonDeniedAddress:   http.StatusForbidden,
	ReasonWorkerEndpoint:  http.StatusForbidden,
	ReasonHostMismatch:    http.StatusForbidden,
	ReasonMethod:          http.StatusMethodNotAllowed,
	ReasonResolve:         http.StatusBadGateway,
	ReasonDial:            http.StatusBadGateway,
	ReasonUpstreamTLS:     http.StatusBadGateway,
	ReasonUpstreamClosed:  http.StatusBadGateway,
	ReasonBadResponse:     http.StatusBadGateway,
	ReasonUpstreamTimeout: http.StatusGatewayTimeout,
	ReasonBadRequest:      http.StatusBadRequest,
	ReasonSmuggling:       http.StatusBadRequest,
	ReasonHeaderTooLarge:  http.StatusRequestHeaderFieldsTooLarge,
	ReasonHeaderTimeout:   http.StatusRequestTimeout,
	ReasonTunnelCap:       http.StatusTooManyRequests,
	ReasonRequestCap:      http.StatusTooManyRequests,
	ReasonByteCap:         http.StatusTooManyRequests,
	ReasonJobEnded:        http.StatusServiceUnavailable,
	ReasonProxyError:      http.StatusBadGateway,
}

// serveConn handles one client connection: forwarded requests, or one CONNECT.
func (p *Proxy) serveConn(ctx context.Context, c net.Conn) {
	conn := &idleConn{Conn: c, idle: p.cfg.Limits.IdleTimeout}
	defer p.survive(conn)
	br := bufio.NewReaderSize(conn, p.cfg.Limits.MaxHeaderBytes+1)
	if p.tunnels.Add(1) > int64(p.cfg.Limits.MaxTunnels) {
		defer p.tunnels.Add(-1)
		if v, ok := p.takeRequest(refuse(ReasonTunnelCap, "too many open connections for this job")); ok {
			p.refuseConn(c, Decision{Time: time.Now()}, v)
		}
		return
	}
	defer p.tunnels.Add(-1)
	for served := false; ; served = true {
		start, err := awaitRequest(br, served)
		if err != nil {
			return
		}
		conn.wrote.Store(false) // a panic in this request is answered while it is
		hd, req, v, err := p.readRequest(conn, br, start)
		if errors.Is(err, errClientDone) && v == nil {
			return
		}
		if v != nil {
			p.refuseConn(c, Decision{Time: start}, v)
			p.lingerClose(c)
			return
		}
		if req.Method == http.MethodConnect {
			p.connect(ctx, conn, br, hd, req)
			return
		}
		if !p.forward(ctx, conn, hd, req, start) {
			return
		}
	}
}

// awaitRequest waits for a connection's next request and returns when it began. The first is
// timed from now: a client that connects has something to say, and header_timeout runs from
// here. A next one may come after a pause of up to idle_timeout (the connection's read
// deadline): a pooled keep-alive connection is idle between requests, which is neither a slow
// header nor a request, so silence or a close there ends the connection with no decision
// (errClientDone), and header_timeout runs from the next request's first byte.
func awaitRequest(br *bufio.Reader, served bool) (time.Time, error) {
	if served {
		if _, err := br.Peek(1); err != nil {
			return time.Time{}, fmt.Errorf("%w: idle between requests: %w", errClientDone, err)
		}
	}
	return time.Now(), nil
}

// readRequest reads and checks one request header, begun at start, then parses it. Every
// request it reads is one of the job's, refused or not (takeRequest); once the job is past its
// request cap it reads none (errClosedUnread).
func (p *Proxy) readRequest(c *idleConn, br *bufio.Reader, start time.Time) (*head, *http.Request, *verdict, error) {
	if p.reqs.Load() > p.cfg.Limits.MaxRequests {
		p.ledger.closedUnread()
		return nil, nil, nil, errClosedUnread
	}
	hd, reason, detail, err := p.readHead(c, br, start)
	if reason == "" && err != nil {
		return nil, nil, nil, err // no request: the client closed, or was idle, before one
	}
	var v *verdict
	if reason != "" {
		v = refuse(reason, detail)
	}
	v, ok := p.takeRequest(v)
	switch {
	case !ok:
		return nil, nil, nil, errClosedUnread
	case v != nil:
		return nil, nil, v, err
	}
	req, err := http.ReadRequest(br)
	if err != nil {
		return nil, nil, refuse(ReasonBadRequest, "unparseable request"), nil
	}
	return hd, req, nil, nil
}

// errClosedUnread ends a connection whose request the proxy did not read or answer: the job
// is past its request cap, and was told so.
var errClosedUnread = fmt.Errorf("%w: the job is past its request cap", errClientDone)

// takeRequest takes a request from max_requests, whatever its fate: v, its refusal if it has
// one, or request_cap for the first past the cap. Refusals were not counted, and past the
// byte cap went unanswered but decided, so a sandbox looping on them had the proxy read and
// decide each (a transcript line, a log line, the worker's time reading up to
// max_header_bytes) without end. Past that first one, ok is false: the request is closed with
// no decision, counted in the summary's closed_unread
// (TestRefusalsCountAgainstTheRequestCap).
func (p *Proxy) takeRequest(v *verdict) (_ *verdict, ok bool) {
	switch n := p.reqs.Add(1); {
	case n <= p.cfg.Limits.MaxRequests:
		return v, true
	case n == p.cfg.Limits.MaxRequests+1:
		return refuse(ReasonRequestCap, "the job's request cap is reached"), true
	}
	p.ledger.closedUnread()
	return nil, false
}

// refuseConn records a refusal and answers it on w with a short plain-text response; a nil w
// (the client speaks TLS by then) gets no answer. The answer is taken from the job's byte cap
// like any byte the proxy writes for the job, and counted in the decision's bytes_in.
// Uncounted, a sandbox could have the proxy answer refusals for ever.
func (p *Proxy) refuseConn(w io.Writer, d Decision, v *verdict) {
	d.Allowed, d.Reason, d.Detail = false, v.reason, v.detail
	if !d.Time.IsZero() {
		d.Duration = time.Since(d.Time)
	}
	var answer, note string
	if w != nil {
		var n int64
		answer, n, note = p.takeAnswer(v)
		d.BytesIn += n
		d.Detail += note
	}
	p.decide(d)
	if answer != "" {
		_, _ = io.WriteString(w, answer)
	}
}

// takeAnswer takes the answer to v from the job's byte cap and returns it with its size. At
// the cap the answer is the byte_cap one, in the room kept for it, and once that is used it
// is nothing: the client sees the connection close. note says so for the decision.
func (p *Proxy) takeAnswer(v *verdict) (answer string, n int64, note string) {
	for _, a := range []struct {
		v    *verdict
		note string
	}{{v, ""}, {&capReached, " (answered byte_cap: the job's byte cap is reached)"}} {
		answer := refusal(a.v)
		if m := p.answerMeter(a.v); m.takeAll(len(answer)) == nil {
			return answer, int64(len(answer)), a.note
		}
	}
	return "", 0, " (not answered: the job's byte cap is reached)"
}

// refusal is the response that answers v.
func refusal(v *verdict) string {
	status, ok := statusOf[v.reason]
	if !ok {
		status = http.StatusForbidden
	}
	body := fmt.Sprintf("boxcar egress: denied (%s): %s\n", v.reason, v.detail)
	return fmt.Sprintf("HTTP/1.1 %d %s\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Length: %d\r\nConnection: close\r\nX-Boxcar-Egress: %s\r\n\r\n%s",
		status, http.StatusText(status), len(body), v.reason, body)
}

// jobCap is one of the job's caps a new request must be under.
type jobCap struct {
	reason Reason
	detail string
	over   func(p *Proxy) bool
}

// jobCaps are checked, in order, for each forwarded request, CONNECT and request inside a
// terminated tunnel, before anything is dialled or sent.
var jobCaps = []jobCap{
	// At the byte cap nothing more may move: a request admitted now would dial, and send
	// what the meters let through of its header (nothing), for a refusal after the fact.
	{capReached.reason, capReached.detail, func(p *Proxy) bool { return p.bytes.Load() >= p.dataCap() }},
}

// replay takes one request from the job's request cap for a request sent again (upstream.go),
// and reports whether there was room.
func (p *Proxy) replay() bool { return p.reqs.Add(1) <= p.cfg.Limits.MaxRequests }

// admit refuses a request with the first of the job's caps it is over (the request was taken
// from max_requests as it was read: takeRequest).
func (p *Proxy) admit() *verdict {
	for _, c := range jobCaps {
		if c.over(p) {
			return refuse(c.reason, c.detail)
		}
	}
	return nil
}

// outcomes say how an exchange that ended in an error is recorded, on every path alike (a
// forwarded request, a request in a terminated tunnel, a spliced tunnel): the first row whose
// match holds. Before the upstream answered (no response header; in a spliced tunnel, no byte
// back) the failure is the decision: a request the policy allowed that got nothing is recorded
// as its failure, never as allowed. Once it answered, the exchange stays allowed and after's
// detail says why the transfer ended, unless after has a reason (the byte cap cuts it). A row
// with no after is a failure that only comes before an answer.
var outcomes = []struct {
	match         func(error) bool
	before, after verdict
}{
	// The proxy panicked (guard.go): whatever else the error says followed from that.
	{is(errPanicked), panicked, panicked},
	// The job's proxy stopped and closed every connection under the exchange, whose own error
	// (a closed connection, a canceled request) says nothing of the upstream (jobEnded).
	{is(errJobEnded), verdict{ReasonJobEnded, "the job ended before the upstream answered"}, verdict{"", "closed when the job ended"}},
	{is(errByteCap), capReached, verdict{ReasonByteCap, "cut at the job's byte cap"}},
	// A replay past max_requests: the host closed the connection the request went on before
	// it answered, and the request, sent once, was not sent again.
	{is(errRequestCap), verdict{ReasonRequestCap, "the job's request cap is reached: the host closed the connection before it answered, and the request was not sent again"}, verdict{}},
	// The sandbox left before the CONNECT's 200 reached it: no tunnel, nothing dialled, but
	// the request was admitted and its name resolved, so it counts against max_requests.
	{is(errNotEstablished), verdict{ReasonBadRequest, "the sandbox closed or reset its connection before the proxy's 200 reached it: no tunnel was opened"}, verdict{}},
	{is(errClientBody), verdict{ReasonBadRequest, "the request's body did not arrive whole from the sandbox, so the upstream did not get it"},
		verdict{"", "the request's body did not arrive whole from the sandbox"}},
	// Idle is no traffic either way: before an answer, the sandbox has said its part (a
	// request, a ClientHello) and waits on the upstream, whichever side's deadline fired.
	{timedOut, verdict{ReasonUpstreamTimeout, "the upstream sent no response within idle_timeout"},
		verdict{"", "closed after idle_timeout with no traffic either way"}},
	{is(errSandbox), verdict{ReasonBadRequest, "the sandbox closed or reset its connection before the upstream answered"},
		verdict{"", "the sandbox closed or reset its connection before the end"}},
	{is(errDial), verdict{ReasonDial, "the upstream did not answer the dial"}, verdict{}},
	{is(errUpstreamTLS), verdict{ReasonUpstreamTLS, "TLS with the upstream failed: its certificate did not verify, or it ended the handshake"}, verdict{}},
	{is(errResponseHeaderTooLarge), verdict{ReasonBadResponse, "the upstream's response header is over 1 MiB"}, verdict{}},
	{is(syscall.ECONNRESET), verdict{ReasonUpstreamClosed, "the upstream reset the connection before it answered"},
		verdict{"", "the upstream reset the connection before the end"}},
	{anyOf(io.EOF, io.ErrUnexpectedEOF, syscall.EPIPE), verdict{ReasonUpstreamClosed, "the upstream closed the connection before it answered"},
		verdict{"", "the upstream closed the connection before the end"}},
	// Every other failure: an answer http.ReadResponse does not take for an HTTP/1.1 response
	// the proxy carries (a parse error, an Upgrade), or a transfer that failed after it.
	{func(error) bool { return true }, verdict{ReasonBadResponse, "the upstream's answer is not an HTTP/1.1 response the proxy carries"},
		verdict{"", "the transfer failed before the end"}},
}

// Errors that say which side failed, where the error alone would not.
var (
	errClientBody             = errors.New("egress: reading the request body from the sandbox")
	errSandbox                = errors.New("egress: the sandbox's connection")
	errNotEstablished         = errors.New("egress: writing the CONNECT's 200 to the sandbox")
	errDial                   = errors.New("egress: dial")
	errResponseHeaderTooLarge = errors.New("egress: upstream response header too large")
	errJobEnded               = errors.New("egress: the job ended")
)

// jobEnded marks err, which ended an exchange, as the job's end when the proxy's ctx is done.
func jobEnded(ctx context.Context, err error) error {
	if err == nil || ctx.Err() == nil {
		return err
	}
	return fmt.Errorf("%w: %w", errJobEnded, err)
}

func is(target error) func(error) bool { return func(err error) bool { return errors.Is(err, target) } }

func anyOf(targets ...error) func(error) bool {
	return func(err error) bool {
		return slices.ContainsFunc(targets, func(t error) bool { return errors.Is(err, t) })
	}
}

// timedOut matches a deadline passed on the connection or the Transport's wait for a response
// header (ResponseHeaderTimeout, whose error is only a net.Error).
func timedOut(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// outcome is how an exchange that ended in err is recorded: its row of outcomes, for an
// upstream that had answered or not.
func outcome(err error, answered bool) *verdict {
	if fr := (*formRefusal)(nil); errors.As(err, &fr) {
		return fr.v // a form naming a refused method, cut on its way upstream
	}
	for _, o := range outcomes {
		if !o.match(err) {
			continue
		}
		if answered && o.after != (verdict{}) {
			return &o.after
		}
		return &o.before
	}
	panic("egress: outcomes ends in a row for every error")
}

// settleOutcome marks d with the outcome of err, when err ended the exchange: a verdict with a
// reason denies it, one without keeps it allowed and says why it ended.
func settleOutcome(d *Decision, err error, answered bool) {
	d.Allowed = true
	if err == nil {
		return
	}
	v := outcome(err, answered)
	d.Detail = v.detail
	if v.reason != "" {
		d.Allowed, d.Reason = false, v.reason
	}
}

// sandboxConn marks the errors of the sandbox's side of a connection (errSandbox), so that a
// sandbox that closed, reset or stopped reading is not taken for the upstream.
type sandboxConn struct{ net.Conn }

func (c sandboxConn) Read(b []byte) (int, error) {
	n, err := c.Conn.Read(b)
	return n, sandboxErr(err)
}

func (c sandboxConn) Write(b []byte) (int, error) {
	n, err := c.Conn.Write(b)
	return n, sandboxErr(err)
}

// sandboxErr wraps err in errSandbox, but for io.EOF, which io.Copy needs as it is.
func sandboxErr(err error) error {
	if err == nil || err == io.EOF { //nolint:errorlint // io.Copy ends at io.EOF itself, compared with ==
		return err
	}
	return fmt.Errorf("%w: %w", errSandbox, err)
}
