package egress

import (
	"bufio"
	"context"
	"crypto/tls"
	"encoding/base64"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"strconv"
	"strings"
	"time"
)

// tunnel is a terminated CONNECT to a secret-bound host.
type tunnel struct {
	h       host
	port    int
	addr    netip.AddrPort
	secrets []*secret
	client  *tls.Conn
}

// authority is the tunnel's host:port, as a URL's host.
func (t *tunnel) authority() string {
	return net.JoinHostPort(t.h.String(), strconv.Itoa(t.port))
}

// intercept terminates the client's TLS with a leaf from the job's CA, then forwards each
// request inside on TLS verified against the host's roots, swapping placeholders in headers.
func (p *Proxy) intercept(ctx context.Context, ic *idleConn, client net.Conn, h host, port int, addr netip.AddrPort, secrets []*secret, d Decision) {
	leaf, err := p.ca.leaf(h.String())
	if err != nil {
		p.refuseConn(nil, d, refuse(ReasonClientTLS, "no leaf certificate"))
		return
	}
	tc := tls.Server(client, &tls.Config{Certificates: []tls.Certificate{*leaf}, NextProtos: []string{"http/1.1"}, MinVersion: tls.VersionTLS12})
	ic.hard = time.Now().Add(p.cfg.Limits.HeaderTimeout)
	err = tc.HandshakeContext(ctx)
	ic.hard = time.Time{}
	if err != nil {
		p.refuseConn(nil, d, refuse(ReasonClientTLS, "TLS with the sandbox failed; does it trust the job CA?"))
		return
	}
	p.cfg.Metrics.tunnel("intercept")
	d.Allowed, d.Duration = true, time.Since(d.Time)
	p.decide(d) // the tunnel itself; each request inside is a decision of its own
	t := &tunnel{h: h, port: port, addr: addr, secrets: secrets, client: tc}
	defer tc.Close()
	stop := p.afterFunc(ctx, "tunnel's close", func() { tc.Close() })
	defer stop()
	tbr := bufio.NewReaderSize(tc, p.cfg.Limits.MaxHeaderBytes+1)
	for served := false; ; served = true {
		start, err := awaitRequest(tbr, served)
		if err != nil {
			return
		}
		hd, req, v, err := p.readRequest(ic, tbr, start)
		if errors.Is(err, errClientDone) && v == nil {
			return
		}
		if v != nil {
			p.refuseConn(tc, Decision{Time: start, Host: h.String(), Port: port}, v)
			p.lingerTLS(tc)
			return
		}
		if !p.interceptOne(ctx, t, hd, req, start) {
			return
		}
	}
}

// interceptOne checks one request inside a terminated tunnel, swaps placeholders and forwards
// it. It reports whether the tunnel may carry another.
func (p *Proxy) interceptOne(ctx context.Context, t *tunnel, hd *head, req *http.Request, start time.Time) bool {
	d := Decision{Time: start, Method: req.Method, Host: t.h.String(), Port: t.port, Addr: t.addr.String(), Reason: ReasonIntercepted}
	v := checkMethod(req)
	if v == nil {
		v = checkTargetForm(req)
	}
	if v == nil && req.URL.Host != "" {
		v = sameHost(req.URL.Host, t.h, t.port, 443)
	}
	if v == nil {
		v = sameHost(hd.host, t.h, t.port, 443)
	}
	if v == nil {
		v = p.admit()
	}
	if v == nil {
		v = checkForm(req)
	}
	if v != nil {
		p.refuseConn(t.client, d, v)
		p.lingerTLS(t.client)
		return false
	}
	stripRequest(req.Header)
	// An encoded body or a piece of one could not be scrubbed of values the server echoes
	// (scrub.go). Asked for before the swap, so a placeholder in the sandbox's Accept-Encoding
	// or Range is no use of a secret.
	askWhole(req.Header)
	sent := req.Header.Clone()
	d.Secrets = swapSecrets(req.Header, t.secrets)
	// The answer is scrubbed of every value the host may hold, not only those bound on this
	// port: a value it got on another port, or in an earlier job, comes back on this one too.
	swaps := append(tunnelSwaps(p.heldFor(ctx, t.h, t.addr.Addr())), basicSwaps(sent, req.Header)...)
	return p.relay(ctx, t, req, swaps, &d)
}

// checkTargetForm refuses a request-target inside a terminated tunnel that is not origin-form
// ("/path"), absolute-form with a host ("https://host/path", checked against the tunnel's host
// next) or asterisk-form ("OPTIONS *"). net/http parses "x:http://evil.example/" as an opaque
// URL with no host, so no host check would see it, and the Transport writes it upstream as it
// came: the bound host's server reads it as an absolute-form request for another host (RFC 9112
// 3.2.2 tells it to ignore Host) and a shared front end routes the swapped secret there.
func checkTargetForm(req *http.Request) *verdict {
	u := req.URL
	switch {
	case u.Opaque != "":
	case u.Scheme == "" && u.Host == "" && strings.HasPrefix(u.Path, "/"):
		return nil
	case (u.Scheme == "https" || u.Scheme == "http") && u.Host != "":
		return nil
	case req.Method == http.MethodOptions && req.RequestURI == "*":
		return nil
	}
	return refuse(ReasonBadRequest, "a request-target must be /path or https://host/path; send the path and the host in Host")
}

// relay sends one request upstream through the Transport and streams the answer back, with
// the values in swaps turned back into placeholders.
func (p *Proxy) relay(ctx context.Context, t *tunnel, req *http.Request, swaps []swap, d *Decision) bool {
	out := p.meter()
	in := p.meter()
	client := sandboxConn{t.client}
	keep := !req.Close
	body := &meteredBody{p: p}
	err := continue100(client, req, in)
	var o *http.Request
	var s *sending
	if err == nil {
		o, s, err = outbound(ctx, t, req, out, body, p.replay)
	}
	var resp *http.Response
	if err == nil {
		resp, err = notSwitched(p.transport.RoundTrip(o))
	}
	if err != nil {
		if s != nil {
			s.end(d)
			err = s.cause(err)
		}
		d.BytesOut, d.BytesIn = out.n.Load(), d.BytesIn+in.n.Load()
		if d.BytesOut == 0 {
			// Its header, where the values are, is written whole or not at all: a request that
			// never reached its host (a failed dial, its TLS unverified, the byte cap) used no
			// secret, and its decision named them (TestUnsentRequestNamesNoSecret).
			d.Secrets = nil
		}
		p.refuseConn(t.client, *d, outcome(jobEnded(ctx, err), false))
		p.lingerTLS(t.client)
		return false
	}
	if to := s.addr(); to.IsValid() && to.Addr() != t.addr.Addr() {
		// A kept connection, dialled for an earlier tunnel to the address its resolution
		// gave: the answer is that server's, and may hold what the hosts at its address hold
		// (TestStoredEchoOnAPooledConnectionIsScrubbed).
		swaps = append(swaps, tunnelSwaps(p.heldFor(ctx, t.h, to.Addr()))...)
	}
	stripHop(resp.Header)
	scrubResponse(resp, swaps)
	resp.Close = !keep
	d.Status = resp.StatusCode
	err = resp.Write(meteredWriter{client, in})
	resp.Body.Close()
	if fr := body.stop(t.client); fr != nil {
		err = fr // found as the answer went on: the body was cut all the same
	}
	if s.end(d); d.Sent > 1 && err == nil {
		d.Detail = fmt.Sprintf("sent %d times: the host closed a kept-alive connection before it answered, and the request was one to replay", d.Sent)
	}
	// An upstream may answer before it has taken the whole body (a refused upload); the
	// Transport then went on reading the body from the sandbox's connection (stopped above),
	// and reading the next request beside it would race on that stream and frame body bytes as
	// a request. Such a tunnel ends here, as a server closes a connection whose body it did
	// not read.
	return p.settle(d, out, in, jobEnded(ctx, err)) && keep && body.done.Load()
}

// swapSecrets replaces each bound secret's placeholder with its value in every header field,
// inside Basic credentials too, and returns the names of the secrets it used.
func swapSecrets(h http.Header, secrets []*secret) []string {
	used := map[string]bool{}
	for k, vals := range h {
		for i, v := range vals {
			vals[i] = swapValue(v, secrets, used)
		}
		h[k] = vals
	}
	var names []string
	for _, s := range secrets {
		if used[s.env] {
			names = append(names, s.env)
		}
	}
	return names
}

func swapValue(v string, secrets []*secret, used map[string]bool) string {
	if scheme, cred, ok := strings.Cut(v, " "); ok && strings.EqualFold(scheme, "Basic") {
		if raw, err := base64.StdEncoding.DecodeString(strings.TrimSpace(cred)); err == nil {
			if swapped := swapPlain(string(raw), secrets, used); swapped != string(raw) {
				return scheme + " " + base64.StdEncoding.EncodeToString([]byte(swapped))
			}
		}
	}
	return swapPlain(v, secrets, used)
}

// swapPlain replaces each placeholder in v with its value in one pass over v as the sandbox
// sent it: a value put in is never read again as part of another placeholder. The sandbox
// knows every placeholder, so one whose first byte a value's last byte completes was its to
// send ("<placeholder A>" then the rest of B's): replaced in turn, it took the value of B
// upstream with the rest of A's beside it in clear, which an echo brought back unscrubbed.
func swapPlain(v string, secrets []*secret, used map[string]bool) string {
	pairs := make([]string, 0, 2*len(secrets))
	for _, s := range secrets {
		if strings.Contains(v, s.placeholder) {
			pairs = append(pairs, s.placeholder, s.value)
			used[s.env] = true
		}
	}
	if len(pairs) == 0 {
		return v
	}
	return strings.NewReplacer(pairs...).Replace(v)
}
