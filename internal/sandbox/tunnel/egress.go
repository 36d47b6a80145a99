package tunnel

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"

	"github.com/hashicorp/yamux"
)

// Egress over a command session: instead of a pods/exec of its own for the tunnel (Arg), a pod
// with a command session gets its egress on that session. The worker asks with one stream (a
// header with Egress and no argv); the pod's side listens on bridge.ListenAddr (fixed in this
// package, never from the request), answers exit code 0 once it listens, and from then on
// carries each connection it accepts as a stream it opens toward the worker on the same
// session, as Pod does on the tunnel's own. The request's stream stays open as the listener's
// life: the worker closing it stops the pod's listener, and the session's end stops both.
//
// The worker's side holds what the pod's side sends within the session's bounds: the streams
// it opens wait in yamux's accept backlog (256) until the proxy takes them, each holding at
// most yamux's window (256 KiB) unread; a stream beyond the backlog is refused. One goroutine
// per session (acceptEgress) takes them from the backlog, one at a time as the listener's
// Accept asks, and closes those that come while no listener is open: a connection the pod's
// side accepted just as the worker closed its listener. Left unaccepted, such a stream's open
// would time out (75 s), and yamux then ends the whole session.

// ErrEgressUnsupported is an egress request the pod's side refused without trying: a pod's
// side that predates it (an older worker image as the bridge). The caller opens the tunnel
// its own way (Arg, over a pods/exec of its own).
var ErrEgressUnsupported = errors.New("command session: the pod's side offers no egress")

// maxEgressSaid bounds what the worker keeps of why the pod's side could not listen.
const maxEgressSaid = 1024

// serveEgress is the pod's side of an egress request on ctrl: it listens with listen, answers
// exit code 0, and carries each connection as a stream it opens on sess until the worker
// closes ctrl or the session ends. A listen that fails is exit code 1 with its reason on
// stderr; a nil listen refuses the request as a pod's side that does not know it does.
func serveEgress(ctrl *yamux.Stream, fw *frameWriter, sess *yamux.Session, listen func() (net.Listener, error)) {
	if listen == nil {
		_ = fw.frame(frameFailed, []byte("read the command: no argv"))
		return
	}
	ln, err := listen()
	if err != nil {
		_ = fw.frame(frameStderr, []byte(err.Error()))
		sendExit(fw, 1)
		return
	}
	sendExit(fw, 0)
	go func() {
		// The worker sends nothing more: its close, or the session's end, stops the listener.
		_, _ = io.Copy(io.Discard, ctrl)
		ln.Close()
	}()
	_ = carryAll(ln, sess)
}

// Egress asks the pod's side to listen for the sandbox's egress and returns the listener each
// of its connections arrives on; it waits until the pod's side listens (or ctx ends).
// ErrSessionDown means the request was not sent, ErrEgressUnsupported that the pod's side does
// not know it: either way nothing listens, and the caller may open the tunnel another way.
// Closing the listener stops the pod's listener; closing the session ends everything.
func (c *Commands) Egress(ctx context.Context) (net.Listener, error) {
	st, err := c.open(header{Egress: true})
	if err != nil {
		return nil, err
	}
	said := &capped{max: maxEgressSaid}
	code, err := await(ctx, st, io.Discard, said)
	switch {
	case errors.Is(err, errNotStarted):
		err = fmt.Errorf("%w: %w", ErrEgressUnsupported, err)
	case err == nil && code != 0:
		err = fmt.Errorf("command session: egress: the pod's side could not listen (exit %d): %q", code, said.b)
	}
	if err != nil {
		st.Close()
		return nil, err
	}
	lctx, stop := context.WithCancel(context.Background())
	l := &sessionListener{c: c, ctrl: st, conns: make(chan *yamux.Stream), ctx: lctx, stop: stop}
	c.egressMu.Lock()
	c.egressTo = l
	c.egressMu.Unlock()
	c.acceptOnce.Do(func() { go c.acceptEgress() })
	return l, nil
}

// acceptEgress takes each stream the pod's side opens, until the session ends, and hands it
// to the open listener's Accept, or closes it when no listener is open or the one it waited
// for closes.
func (c *Commands) acceptEgress() {
	for {
		s, err := c.sess.AcceptStream()
		if err != nil {
			return
		}
		c.egressMu.Lock()
		l := c.egressTo
		c.egressMu.Unlock()
		if l == nil {
			s.Close()
			continue
		}
		select {
		case l.conns <- s:
		case <-l.ctx.Done():
			s.Close()
		case <-c.sess.CloseChan():
			s.Close()
			return
		}
	}
}

// sessionListener hands out the streams the pod's side opens as connections. Its Close ends
// the request's stream, which stops the pod's listener; the session goes on.
type sessionListener struct {
	c     *Commands
	ctrl  *yamux.Stream
	conns chan *yamux.Stream // from acceptEgress
	ctx   context.Context
	stop  context.CancelFunc
}

func (l *sessionListener) Accept() (net.Conn, error) {
	select {
	case s := <-l.conns:
		if l.ctx.Err() != nil { // both were ready: Close came first
			s.Close()
			return nil, net.ErrClosed
		}
		return conn{s}, nil
	case <-l.ctx.Done():
		return nil, net.ErrClosed
	case <-l.c.sess.CloseChan():
		return nil, yamux.ErrSessionShutdown
	}
}

// Close may be called more than once: a stream's Close is.
func (l *sessionListener) Close() error {
	l.stop()
	l.c.egressMu.Lock()
	if l.c.egressTo == l {
		l.c.egressTo = nil
	}
	l.c.egressMu.Unlock()
	return l.ctrl.Close()
}

func (l *sessionListener) Addr() net.Addr { return l.c.sess.Addr() }

// capped keeps the first max bytes written to it and drops the rest.
type capped struct {
	b   []byte
	max int
}

func (c *capped) Write(p []byte) (int, error) {
	c.b = append(c.b, p[:min(len(p), c.max-len(c.b))]...)
	return len(p), nil
}
