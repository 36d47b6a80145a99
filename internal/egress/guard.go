package egress

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"runtime"
	"runtime/debug"
	"time"
)

// A panic in a goroutine no one recovers ends the process: the worker's, with every job on
// it. The proxy's code runs on goroutines Config.Go starts (a connection's, a spliced
// tunnel's copy), whose guard sees a panic, and on goroutines it does not: net/http's
// Transport's (its dial, its write and read loops, which read the sandbox's body and use the
// Dialer's connection) and context.AfterFunc's (a close). Each panic fails the request it
// served (proxy_error, 502 where the sandbox can still read an answer) and reaches Config.Go's
// guard: one on a goroutine of Config.Go's panics on, once decided; one elsewhere is
// recovered there, made the request's error, and raised again on a goroutine of Config.Go's.
// The worker's guard ends the job's attempt (worker_panicked) and logs it with the job's id;
// the default one logs it. The worker goes on either way.

// errPanicked is a request's failure that was a panic in the proxy (outcomes' first row).
var errPanicked = errors.New("egress: the proxy panicked")

// panicked is the refusal of a request the proxy panicked serving.
var panicked = verdict{ReasonProxyError, "the proxy panicked serving the request (a bug, logged by the worker)"}

// proxyPanic is what a panic in the proxy hands Config.Go's guard: where it was, its value
// and the stack it had there. It prints where and the stack, never the value, which may quote
// what the proxy was handling (a header with a secret swapped in): the worker's guard logs
// what it recovers as it prints.
type proxyPanic struct {
	what  string
	value any
	stack []byte
}

func (e *proxyPanic) Error() string {
	return fmt.Sprintf("egress proxy's %s: %s\n%s", e.what, panicText(e.value), e.stack)
}

// panicText is a panic's value as a log may hold it: a runtime error's text (an index, a nil
// dereference; no data), else its type alone.
func panicText(v any) string {
	if re, ok := v.(runtime.Error); ok {
		return re.Error()
	}
	return fmt.Sprintf("a panic of %T (its value not shown: it may quote a secret)", v)
}

// recovered, deferred on a goroutine Config.Go did not start, turns a panic into *err,
// wrapping errPanicked, and raises it again on a goroutine of Config.Go's.
func (p *Proxy) recovered(what string, err *error) {
	r := recover()
	if r == nil {
		return
	}
	*err = fmt.Errorf("%w in its %s", errPanicked, what)
	pp := &proxyPanic{what: what, value: r, stack: debug.Stack()}
	p.cfg.Go(func() { panic(pp) })
}

// survive, deferred by a connection's goroutine (Config.Go's), decides the request it was
// serving when it panicked (proxy_error, answered 502 when the proxy has written nothing to
// the sandbox for it: after a CONNECT's 200 the sandbox speaks TLS and sees the connection
// close), then panics on, on the same stack, for Config.Go's guard, with a proxyPanic.
func (p *Proxy) survive(c *idleConn) {
	r := recover()
	if r == nil {
		return
	}
	var w net.Conn
	if !c.wrote.Load() {
		w = c.Conn
	}
	p.refuseConn(w, Decision{Time: time.Now()}, &panicked)
	if pp, ok := r.(*proxyPanic); ok { // raised again from another goroutine (a held look-up's)
		panic(pp)
	}
	panic(&proxyPanic{what: "connection", value: r, stack: debug.Stack()})
}

// guardedGo is Config.Go's default: a go statement whose panic is logged and ends nothing
// else. The line names where and has the stack, never the panic's value, which may quote
// what the proxy was handling (a header with a secret swapped in).
func guardedGo(log *slog.Logger) func(func()) {
	return func(f func()) {
		go func() {
			defer func() {
				r := recover()
				if r == nil {
					return
				}
				what, stack := "connection", debug.Stack()
				if pp, ok := r.(*proxyPanic); ok {
					what, stack, r = pp.what, pp.stack, pp.value
				}
				log.Error("egress: the proxy panicked; the request failed, the proxy goes on",
					"in", what, "panic_type", fmt.Sprintf("%T", r), "stack", string(stack))
			}()
			f()
		}()
	}
}

// afterFunc is context.AfterFunc for f, which closes a connection: it runs on a goroutine of
// its own.
func (p *Proxy) afterFunc(ctx context.Context, what string, f func()) func() bool {
	return context.AfterFunc(ctx, func() {
		var err error
		defer p.recovered(what, &err)
		f()
	})
}

// guardedDialer is Config.Dialer with guarded connections.
type guardedDialer struct {
	Dialer
	p *Proxy
}

func (d guardedDialer) DialContext(ctx context.Context, network, address string) (net.Conn, error) {
	c, err := d.Dialer.DialContext(ctx, network, address)
	if err != nil {
		return nil, err
	}
	return &guardedConn{Conn: c, p: d.p}, nil
}

// guardedConn is a connection the Dialer made: the Transport's loops read and write it, a
// context.AfterFunc and a TLS handshake's watch close it, each on a goroutine of its own.
type guardedConn struct {
	net.Conn
	p *Proxy
}

func (c *guardedConn) Read(b []byte) (n int, err error) {
	defer c.p.recovered("upstream connection's Read", &err)
	return c.Conn.Read(b)
}

func (c *guardedConn) Write(b []byte) (n int, err error) {
	defer c.p.recovered("upstream connection's Write", &err)
	return c.Conn.Write(b)
}

func (c *guardedConn) Close() (err error) {
	defer c.p.recovered("upstream connection's Close", &err)
	return c.Conn.Close()
}

// CloseWrite half-closes the connection where it can (closeWrite), else closes it.
func (c *guardedConn) CloseWrite() (err error) {
	defer c.p.recovered("upstream connection's CloseWrite", &err)
	if cw, ok := c.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return c.Conn.Close()
}

func (c *guardedConn) SetDeadline(t time.Time) (err error) {
	defer c.p.recovered("upstream connection's SetDeadline", &err)
	return c.Conn.SetDeadline(t)
}

func (c *guardedConn) SetReadDeadline(t time.Time) (err error) {
	defer c.p.recovered("upstream connection's SetReadDeadline", &err)
	return c.Conn.SetReadDeadline(t)
}

func (c *guardedConn) SetWriteDeadline(t time.Time) (err error) {
	defer c.p.recovered("upstream connection's SetWriteDeadline", &err)
	return c.Conn.SetWriteDeadline(t)
}
