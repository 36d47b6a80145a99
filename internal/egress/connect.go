package egress

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"slices"
	"sync"
	"time"
)

// connect handles a CONNECT: check the target, answer 200, read the ClientHello and check it,
// then either splice to the checked address or, for a secret-bound host or one at its
// address, terminate TLS.
func (p *Proxy) connect(ctx context.Context, c *idleConn, br *bufio.Reader, hd *head, req *http.Request) {
	d := Decision{Time: time.Now(), Method: http.MethodConnect}
	h, port, addr, v := p.checkConnect(ctx, hd, req, &d)
	if v != nil {
		p.refuseConn(c, d, v)
		return
	}
	// The 200 is the proxy's own write to the sandbox: counted like the tunnel's bytes, and,
	// when it cannot be sent (the byte cap, a sandbox gone), decided by outcomes.
	established := p.meter()
	err := established.writeWhole(sandboxConn{c}, "HTTP/1.1 200 Connection established\r\n\r\n")
	d.BytesIn = established.n.Load()
	if err != nil {
		p.refuseConn(c, d, outcome(jobEnded(ctx, fmt.Errorf("%w: %w", errNotEstablished, err)), false))
		return
	}
	hello, v := p.readClientHello(ctx, c, br)
	if v == nil {
		v = checkHello(hello, h)
	}
	if v != nil {
		p.refuseConn(nil, d, v) // the client speaks TLS now: it sees the connection close
		return
	}
	client := prefixConn{Conn: c, r: io.MultiReader(bytes.NewReader(hello.raw), br)}
	// A host at an address a secret-bound host has (another name of its server, the address,
	// a port the secret is not bound on) may hand back what the bound host holds: its TLS is
	// terminated too, with nothing swapped in, so that its answers are scrubbed (held.go).
	if secrets := p.policy.boundSecrets(h, port); len(secrets) > 0 || len(p.heldFor(ctx, h, addr.Addr())) > 0 {
		d.Reason = ReasonIntercepted
		p.intercept(ctx, c, client, h, port, addr, secrets, d)
		return
	}
	d.Reason = ReasonAllowed
	p.splice(ctx, client, addr, d)
}

// clientHello is what the proxy reads of a tunnel's first TLS flight.
type clientHello struct {
	raw []byte // every byte read, to replay
	sni string
	// ech: the hello carries encrypted_client_hello. Its SNI is then only the outer, public
	// name: a server that holds the ECH key (a CDN's front) answers for the inner one, which
	// the proxy cannot read, so a tunnel could reach any host behind an allowed front. Clients
	// that send it without a key of the server's (Chrome's "GREASE") are refused too: the two
	// look alike by design.
	ech bool
}

// extensionECH is encrypted_client_hello's code point (RFC 9849).
const extensionECH = 0xfe0d

// checkConnect checks a CONNECT's authority, Host field, the job's caps and the target.
func (p *Proxy) checkConnect(ctx context.Context, hd *head, req *http.Request, d *Decision) (host, int, netip.AddrPort, *verdict) {
	h, port, err := splitHostPort(req.RequestURI, 0)
	if err != nil {
		return host{}, 0, netip.AddrPort{}, refuse(ReasonBadRequest, "CONNECT needs host:port")
	}
	d.Host, d.Port = h.String(), port
	if v := sameHost(hd.host, h, port, port); v != nil {
		return host{}, 0, netip.AddrPort{}, v
	}
	if v := p.admit(); v != nil {
		return host{}, 0, netip.AddrPort{}, v
	}
	addr, v := p.checkTarget(ctx, h, port)
	if v == nil {
		d.Addr = addr.String() // a refused target has none: "invalid AddrPort" went to the transcript
	}
	return h, port, addr, v
}

// errHelloRead stops the handshake used to parse a ClientHello once it has been read.
var errHelloRead = errors.New("egress: ClientHello read")

// readClientHello reads the client's first TLS flight with crypto/tls's own parser (a
// handshake that stops at GetConfigForClient).
func (p *Proxy) readClientHello(ctx context.Context, c *idleConn, br *bufio.Reader) (clientHello, *verdict) {
	c.hard = time.Now().Add(p.cfg.Limits.HeaderTimeout)
	defer func() { c.hard = time.Time{} }()
	first, err := br.Peek(1)
	if err != nil {
		if errors.Is(err, os.ErrDeadlineExceeded) {
			return clientHello{}, refuse(ReasonHeaderTimeout, "no ClientHello in time")
		}
		return clientHello{}, refuse(ReasonNotTLS, "tunnel closed before a ClientHello")
	}
	if first[0] != 0x16 { // a TLS handshake record
		return clientHello{}, refuse(ReasonNotTLS, "the tunnel does not start with a TLS ClientHello")
	}
	rec := &recordingConn{Conn: c, r: br}
	var hello clientHello
	err = tls.Server(rec, &tls.Config{GetConfigForClient: func(hi *tls.ClientHelloInfo) (*tls.Config, error) {
		hello.sni, hello.ech = hi.ServerName, slices.Contains(hi.Extensions, extensionECH)
		return nil, errHelloRead
	}}).HandshakeContext(ctx)
	switch {
	case errors.Is(err, errHelloRead):
		hello.raw = rec.buf.Bytes()
		return hello, nil
	case errors.Is(err, os.ErrDeadlineExceeded):
		return clientHello{}, refuse(ReasonHeaderTimeout, "ClientHello not complete in time")
	}
	return clientHello{}, refuse(ReasonNotTLS, "not a TLS ClientHello")
}

// recordingConn reads from r, keeps what it read, and swallows writes (the alert a stopped
// handshake sends).
type recordingConn struct {
	net.Conn
	r   io.Reader
	buf bytes.Buffer
}

func (c *recordingConn) Read(b []byte) (int, error) {
	n, err := c.r.Read(b)
	c.buf.Write(b[:n])
	return n, err
}

func (c *recordingConn) Write(b []byte) (int, error) { return len(b), nil }

// checkHello refuses a ClientHello that hides the host it is for (ech) or names another host
// than the CONNECT's. A name needs its SNI; an address target has none (clients do not send
// IP literals as SNI).
func checkHello(hello clientHello, h host) *verdict {
	if hello.ech {
		return refuse(ReasonECH, "the ClientHello encrypts the name it is for (encrypted_client_hello); the proxy decides on names it can read")
	}
	sni := hello.sni
	if sni == "" && h.isIP() {
		return nil
	}
	if sni == "" {
		return refuse(ReasonSNIMismatch, "the ClientHello names no host")
	}
	sh, err := parseHost(sni)
	if err != nil || sh != h {
		return refuse(ReasonSNIMismatch, "the ClientHello names another host than the CONNECT")
	}
	return nil
}

// splice passes the tunnel through to the checked address, both ways, until both sides end.
// It is decided then, on the error that ended it (outcomes), the upstream having answered once
// a byte came back.
func (p *Proxy) splice(ctx context.Context, client net.Conn, addr netip.AddrPort, d Decision) {
	up, v := p.dial(ctx, addr)
	if v != nil {
		p.refuseConn(nil, d, v)
		return
	}
	defer up.Close()
	stop := p.afterFunc(ctx, "upstream's close", func() { up.Close() })
	defer stop()
	p.cfg.Metrics.tunnel("splice")
	out := p.meter()
	in := p.meter()
	iup := &idleConn{Conn: up, idle: p.cfg.Limits.IdleTimeout}
	sc := sandboxConn{client}
	var end firstErr
	var wg sync.WaitGroup
	wg.Add(1)
	p.cfg.Go(func() {
		defer wg.Done()
		var err error
		defer func() {
			// First: the closes below end the other copy too. pipe closes both sides on its
			// errors, not on a panic.
			end.set(err)
			if errors.Is(err, errPanicked) {
				_ = iup.Close()
				_ = sc.Close()
			}
		}()
		defer p.recovered("spliced tunnel's copy", &err)
		err = pipe(iup, sc, out)
	})
	end.set(pipe(sc, iup, in))
	wg.Wait()
	d.BytesOut, d.Duration = out.n.Load(), time.Since(d.Time)
	d.BytesIn += in.n.Load() // after the 200
	err := end.err
	if err == nil && ctx.Err() != nil {
		err = net.ErrClosed // closed under the tunnel, which firstErr takes for a consequence
	}
	settleOutcome(&d, jobEnded(ctx, err), in.n.Load() > 0)
	p.decide(d)
}

// firstErr keeps the error that ended a tunnel: the first either copy met. The copy that fails
// closes both sides, and the other's net.ErrClosed is only its consequence.
type firstErr struct {
	once sync.Once
	err  error
}

func (f *firstErr) set(err error) {
	if err != nil && !errors.Is(err, net.ErrClosed) {
		f.once.Do(func() { f.err = err })
	}
}

// pipe copies src to dst, then half-closes dst; on error it closes both. A src that ends
// before it sent a byte ends in io.EOF: an upstream that closes a tunnel unanswered closed
// it before an answer, as a forwarded request's does.
func pipe(dst, src net.Conn, m *meter) error {
	n, err := io.Copy(meteredWriter{dst, m}, src)
	if err == nil && n == 0 {
		err = io.EOF
	}
	if err != nil {
		_ = dst.Close()
		_ = src.Close()
		return err
	}
	closeWrite(dst)
	return nil
}
