// Package tunnel carries a sandbox pod's egress to the worker's proxy over one pods/exec
// stream. The pod has no route out: the worker execs the worker binary in it (Arg), which
// listens on bridge.ListenAddr in the pod's network namespace and carries every connection
// it accepts as a yamux stream over the exec's stdin and stdout; on the worker, Listen turns
// that exec's streams into the net.Listener the job's proxy serves. The tunnel adds no power:
// the proxy alone decides what a connection may reach. A warm pod's command session
// (CommandsArg) carries the same egress on its own session instead (egress.go), without an
// exec of its own.
//
// An init container puts the binary in the pod: the worker image's own binary, run with
// InstallArg, copies itself into a volume the sandbox container mounts read-only (the
// worker image has no shell to copy with). Both modes run from this package's init, so no
// main needs to know of them; any binary that links internal/sandbox links this.
//
// It owns the wire between the two ends, not the pod spec or the exec (package sandbox).
package tunnel

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"time"

	"github.com/hashicorp/yamux"

	"github.com/boxcar-run/boxcar/internal/sandbox/bridge"
)

// The pod's side runs as `BINARY Arg`; the init container copies its binary with
// `BINARY InstallArg DEST`.
const (
	Arg        = "__boxcar-egress-tunnel"
	InstallArg = "__boxcar-egress-install"
)

// ready is the line the pod's side writes before the yamux session starts: it listens by
// then, so a command run after Listen returns finds bridge.ListenAddr open.
const ready = "boxcar-egress-tunnel ready\n"

// maxReadyLine bounds what Listen reads while waiting for ready: the pod's side is the
// sandbox's, and nothing it sends may cost the worker more.
const maxReadyLine = 256

func init() {
	if len(os.Args) < 2 {
		return
	}
	switch os.Args[1] {
	case Arg:
		os.Exit(runPod())
	case InstallArg:
		os.Exit(runInstall(os.Args[2:]))
	case CommandsArg:
		os.Exit(runCommands())
	}
}

// runPod is the pod's side on the process's own stdio.
func runPod() int {
	ln, err := listenEgress()
	if err != nil {
		fmt.Fprintf(os.Stderr, "egress tunnel: %v\n", err)
		return 1
	}
	if err := Pod(ln, os.Stdin, os.Stdout); err != nil {
		fmt.Fprintf(os.Stderr, "egress tunnel: %v\n", err)
		return 1
	}
	return 0
}

// listenEgress listens where a sandbox's commands find the worker's proxy: bridge.ListenAddr,
// fixed here, never from a job or a request.
func listenEgress() (net.Listener, error) {
	var lc net.ListenConfig
	ln, err := lc.Listen(context.Background(), "tcp", bridge.ListenAddr)
	if err != nil {
		return nil, fmt.Errorf("listen on %s: %w", bridge.ListenAddr, err)
	}
	return ln, nil
}

// runInstall copies the running binary to args[0], executable by anyone, and makes the
// folder the CA goes into beside it (a mount point that must exist before the sandbox
// container mounts the folder read-only).
func runInstall(args []string) int {
	if len(args) != 1 {
		fmt.Fprintf(os.Stderr, "egress tunnel: install: want one destination, got %d\n", len(args))
		return 2
	}
	if err := install(args[0]); err != nil {
		fmt.Fprintf(os.Stderr, "egress tunnel: install: %v\n", err)
		return 1
	}
	return 0
}

func install(dst string) error {
	self, err := os.Executable()
	if err != nil {
		return err
	}
	src, err := os.Open(self)
	if err != nil {
		return err
	}
	defer src.Close()
	if err := os.MkdirAll(filepath.Join(filepath.Dir(dst), "egress"), 0o755); err != nil {
		return err
	}
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o755)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, src); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}

// config is yamux's, quiet: the worker logs what matters itself, and the pod's stderr is
// read only for the reason a tunnel failed.
func config() *yamux.Config {
	c := yamux.DefaultConfig()
	c.LogOutput = io.Discard
	// A stream one side closed and the other never finishes is dropped after this.
	c.StreamCloseTimeout = time.Minute
	return c
}

// Pod is the pod's side: it says ready on out, then carries each connection ln accepts as a
// stream of a yamux session over in and out, until the session ends (the worker closed it,
// or the exec ended). It closes ln.
func Pod(ln net.Listener, in io.Reader, out io.Writer) error {
	defer ln.Close()
	sess, err := clientSession(in, out, ready)
	if err != nil {
		return err
	}
	defer sess.Close()
	go func() {
		<-sess.CloseChan()
		ln.Close() // the worker is gone: clients see refusals, not a hang
	}()
	if err := carryAll(ln, sess); !sess.IsClosed() {
		return err
	}
	return nil
}

// clientSession is a pod side's session: it says ready on out, then runs yamux's client over
// in and out. The worker's twin is serverSession.
func clientSession(in io.Reader, out io.Writer, ready string) (*yamux.Session, error) {
	if _, err := io.WriteString(out, ready); err != nil {
		return nil, fmt.Errorf("say ready: %w", err)
	}
	return yamux.Client(stdio{in, out}, config())
}

// carryAll carries each connection ln accepts as a stream it opens on sess, until ln's Accept
// fails (it was closed); it returns that error, never nil.
func carryAll(ln net.Listener, sess *yamux.Session) error {
	for {
		c, err := ln.Accept()
		if err != nil {
			return err
		}
		go carry(c, sess)
	}
}

// carry copies one connection to a new stream and back, passing a client's half close on,
// as the bubblewrap bridge does with the proxy's socket.
func carry(c net.Conn, sess *yamux.Session) {
	up, err := sess.OpenStream()
	if err != nil {
		c.Close()
		return
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		_, _ = io.Copy(up, c)
		_ = up.Close() // yamux's Close is a half close: the answer still comes back
	}()
	_, _ = io.Copy(c, up)
	c.Close()
	_ = up.Close()
	<-done
}

// stdio is the exec's two streams as one connection.
type stdio struct {
	io.Reader
	io.Writer
}

func (s stdio) Close() error {
	if c, ok := s.Writer.(io.Closer); ok {
		return c.Close()
	}
	return nil
}

// ErrNotReady is a pod's side that ended, or said something else, before it was ready.
var ErrNotReady = errors.New("egress tunnel: the pod's side did not start")

// Listen is the worker's side over the exec's streams: r is the pod side's stdout, w its
// stdin. It waits for the pod's side to say it listens (until ctx ends), then returns the
// listener each of the pod's connections arrives on. Closing the listener ends the session,
// and with it the pod's side (its stdin closes).
func Listen(ctx context.Context, r io.Reader, w io.WriteCloser) (net.Listener, error) {
	sess, err := serverSession(ctx, r, w, ready)
	if err != nil {
		return nil, err
	}
	return listener{sess}, nil
}

// serverSession is the worker's side of a session over a pod side's stdout (r) and stdin (w):
// it waits for the pod's side to say ready (until ctx ends), then runs yamux's server over
// them. It closes w when it fails. The pod's twin is clientSession.
func serverSession(ctx context.Context, r io.Reader, w io.WriteCloser, ready string) (*yamux.Session, error) {
	br, err := awaitReady(ctx, r, w, ready)
	if err != nil {
		return nil, err
	}
	sess, err := yamux.Server(stdio{br, w}, config())
	if err != nil {
		w.Close()
		return nil, err
	}
	return sess, nil
}

// awaitReady reads the pod side's first line, which must be want, until ctx ends; it closes w
// when it fails. It returns r's reader, which may hold what followed the line.
func awaitReady(ctx context.Context, r io.Reader, w io.WriteCloser, want string) (*bufio.Reader, error) {
	br := bufio.NewReaderSize(r, maxReadyLine)
	said := make(chan error, 1)
	go func() {
		line, err := br.ReadSlice('\n')
		if err == nil && string(line) != want {
			err = fmt.Errorf("%w: it said %q", ErrNotReady, line)
		} else if err != nil {
			err = fmt.Errorf("%w: %w", ErrNotReady, err)
		}
		said <- err
	}()
	select {
	case err := <-said:
		if err != nil {
			w.Close()
			return nil, err
		}
	case <-ctx.Done():
		w.Close()
		return nil, fmt.Errorf("wait for the pod's side: %w", context.Cause(ctx))
	}
	return br, nil
}

// listener hands out the session's streams as connections that close as a net.Conn does.
type listener struct{ *yamux.Session }

func (l listener) Accept() (net.Conn, error) {
	s, err := l.AcceptStream()
	if err != nil {
		return nil, err
	}
	return conn{s}, nil
}

// conn is a stream whose Close also ends its reads at once, as a net.Conn's does (yamux's
// Close is a half close, whose reads go on until the other side closes too), and whose
// CloseWrite is yamux's half close.
type conn struct{ *yamux.Stream }

func (c conn) CloseWrite() error { return c.Stream.Close() }

func (c conn) Close() error {
	err := c.Stream.Close()
	_ = c.SetReadDeadline(time.Now())
	return err
}
