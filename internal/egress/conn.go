package egress

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"time"
)

// statusOf is the HTTP status a refusal answers with, when the client can still read one.
var statusOf = map[Reason]int{
	ReasonNotAllowed:     http.StatusForbidden,
	ReasonDeniedAddress:  http.StatusForbidden,
	ReasonWorkerEndpoint: http.StatusForbidden,
	ReasonHostMismatch:   http.StatusForbidden,
	ReasonMethod:         http.StatusMethodNotAllowed,
	ReasonResolve:        http.StatusBadGateway,
	ReasonDial:           http.StatusBadGateway,
	ReasonUpstreamTLS:    http.StatusBadGateway,
	ReasonBadRequest:     http.StatusBadRequest,
	ReasonSmuggling:      http.StatusBadRequest,
	ReasonHeaderTooLarge: http.StatusRequestHeaderFieldsTooLarge,
	ReasonHeaderTimeout:  http.StatusRequestTimeout,
	ReasonTunnelCap:      http.StatusTooManyRequests,
	ReasonRequestCap:     http.StatusTooManyRequests,
	ReasonByteCap:        http.StatusTooManyRequests,
}

// serveConn handles one client connection: forwarded requests, or one CONNECT.
func (p *Proxy) serveConn(ctx context.Context, c net.Conn) {
	conn := &idleConn{Conn: c, idle: p.cfg.Limits.IdleTimeout}
	br := bufio.NewReaderSize(conn, p.cfg.Limits.MaxHeaderBytes+1)
	if p.tunnels.Add(1) > int64(p.cfg.Limits.MaxTunnels) {
		defer p.tunnels.Add(-1)
		p.refuseConn(c, Decision{Time: time.Now()}, refuse(ReasonTunnelCap, "too many open connections for this job"))
		return
	}
	defer p.tunnels.Add(-1)
	for {
		hd, req, v, err := p.readRequest(conn, br)
		start := time.Now()
		if errors.Is(err, errClientDone) && v == nil {
			return
		}
		if v != nil {
			p.refuseConn(c, Decision{Time: start}, v)
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

// readRequest reads and checks one request header, then parses it.
func (p *Proxy) readRequest(c *idleConn, br *bufio.Reader) (*head, *http.Request, *verdict, error) {
	hd, reason, detail, err := p.readHead(c, br)
	if reason != "" {
		return nil, nil, refuse(reason, detail), err
	}
	if err != nil {
		return nil, nil, nil, err
	}
	req, err := http.ReadRequest(br)
	if err != nil {
		return nil, nil, refuse(ReasonBadRequest, "unparseable request"), nil
	}
	return hd, req, nil, nil
}

// refuseConn records a refusal and answers it with a short plain-text response.
func (p *Proxy) refuseConn(w io.Writer, d Decision, v *verdict) {
	d.Allowed, d.Reason, d.Detail = false, v.reason, v.detail
	if !d.Time.IsZero() {
		d.Duration = time.Since(d.Time)
	}
	p.decide(d)
	writeRefusal(w, v)
}

func writeRefusal(w io.Writer, v *verdict) {
	status, ok := statusOf[v.reason]
	if !ok {
		status = http.StatusForbidden
	}
	body := fmt.Sprintf("boxcar egress: denied (%s): %s\n", v.reason, v.detail)
	fmt.Fprintf(w, "HTTP/1.1 %d %s\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Length: %d\r\nConnection: close\r\nX-Boxcar-Egress: %s\r\n\r\n%s",
		status, http.StatusText(status), len(body), v.reason, body)
}

// countRequest takes one request from the job's cap.
func (p *Proxy) countRequest() *verdict {
	if p.reqs.Add(1) > p.cfg.Limits.MaxRequests {
		return refuse(ReasonRequestCap, "the job's request cap is reached")
	}
	return nil
}
