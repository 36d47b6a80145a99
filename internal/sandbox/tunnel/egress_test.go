package tunnel_test

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"sync/atomic"
	"testing"

	"github.com/hashicorp/yamux"

	"github.com/boxcar-run/boxcar/internal/sandbox/tunnel"
	"github.com/boxcar-run/boxcar/test/harness"
)

// egressSession is a command session whose pod side listens for egress on a loopback listener
// of the test's (in a pod: bridge.ListenAddr); it returns the session and where the pod's side
// listens once asked.
func egressSession(t *testing.T) (*tunnel.Commands, string) {
	t.Helper()
	podLn, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { podLn.Close() })
	var asked atomic.Bool
	listen := func() (net.Listener, error) {
		if asked.Swap(true) {
			return nil, errors.New("asked twice")
		}
		return podLn, nil
	}
	return commandSessionWith(t, listen), podLn.Addr().String()
}

// TestCommandsEgress: egress over a command session carries a command's connections to the
// worker's listener and the answers back, half closes included, many at once past yamux's
// window; the session's commands still run beside them.
func TestCommandsEgress(t *testing.T) {
	c, addr := egressSession(t)
	ln, err := c.Egress(t.Context())
	if err != nil {
		t.Fatalf("Egress: %v", err)
	}
	p := &pair{addr: addr, ln: ln}
	wg := p.echo(t)
	defer wg.Wait()
	defer ln.Close()

	if got := ask(t, addr, "ping"); got != "got ping" {
		t.Errorf("answer %q, want %q", got, "got ping")
	}
	answered := make(chan error, 20)
	for i := range cap(answered) {
		go func() {
			err := fmt.Errorf("client %d: ended before its answer", i) // ask failed the test
			defer func() { answered <- err }()
			msg := fmt.Sprintf("client %d %s", i, make([]byte, 100_000))
			if got := ask(t, addr, msg); got != "got "+msg {
				err = fmt.Errorf("client %d: answer of %d bytes, want %d", i, len(got), len(msg)+4)
				return
			}
			err = nil
		}()
	}
	for range cap(answered) {
		if err := <-answered; err != nil {
			t.Error(err)
		}
	}
	if code, err := c.Run(t.Context(), tunnel.Command{Argv: []string{"true"}, Stdout: io.Discard, Stderr: io.Discard}); err != nil || code != 0 {
		t.Errorf("a command beside egress: %d, %v", code, err)
	}
}

// TestCommandsEgressListenerClose: closing the worker's listener stops the pod's (a client is
// refused, not left hanging) and leaves the session's commands running; a second request then
// reaches the pod's side again.
func TestCommandsEgressListenerClose(t *testing.T) {
	c, addr := egressSession(t)
	ln, err := c.Egress(t.Context())
	if err != nil {
		t.Fatalf("Egress: %v", err)
	}
	if err := ln.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := ln.Accept(); !errors.Is(err, net.ErrClosed) {
		t.Errorf("Accept after Close: %v, want net.ErrClosed", err)
	}
	harness.Wait(t, "the pod's side to stop listening", func() (bool, error) {
		conn, err := net.Dial("tcp", addr)
		if err != nil {
			return true, nil
		}
		conn.Close()
		return false, errors.New("it still listens after the worker closed its listener")
	})
	if code, err := c.Run(t.Context(), tunnel.Command{Argv: []string{"true"}, Stdout: io.Discard, Stderr: io.Discard}); err != nil || code != 0 {
		t.Errorf("a command after the listener's close: %d, %v", code, err)
	}
	// The test's listen gives its listener once: a second request is the pod's refusal.
	if _, err := c.Egress(t.Context()); err == nil || errors.Is(err, tunnel.ErrEgressUnsupported) {
		t.Errorf("a second Egress: %v, want the pod's side's listen error", err)
	}
}

// TestCommandsEgressRefused: a pod's side that does not know the request (an older bridge),
// or offers no egress, is ErrEgressUnsupported: the caller opens the tunnel its own way. A
// closed session is ErrSessionDown.
func TestCommandsEgressRefused(t *testing.T) {
	t.Run("older pod side", func(t *testing.T) {
		c := oldPodSide(t)
		if _, err := c.Egress(t.Context()); !errors.Is(err, tunnel.ErrEgressUnsupported) {
			t.Errorf("Egress: %v, want ErrEgressUnsupported", err)
		}
	})
	t.Run("no egress offered", func(t *testing.T) {
		if _, err := commandSession(t).Egress(t.Context()); !errors.Is(err, tunnel.ErrEgressUnsupported) {
			t.Errorf("Egress: %v, want ErrEgressUnsupported", err)
		}
	})
	t.Run("session down", func(t *testing.T) {
		c := commandSession(t)
		c.Close()
		if _, err := c.Egress(t.Context()); !errors.Is(err, tunnel.ErrSessionDown) {
			t.Errorf("Egress: %v, want ErrSessionDown", err)
		}
	})
}

// oldPodSide is a pod's side as the command session's was before egress: a header without an
// argv is refused with a frameFailed ("read the command: no argv"), whatever else it holds.
func oldPodSide(t *testing.T) *tunnel.Commands {
	t.Helper()
	return fakePodSide(t, func(_ *yamux.Session, st *yamux.Stream) {
		if _, err := bufio.NewReader(st).ReadBytes('\n'); err != nil {
			return
		}
		writeFrame(st, 4, []byte("read the command: no argv")) // frameFailed
		st.Close()
	})
}

// writeFrame writes one frame of the command session's protocol: its kind, its length and p.
func writeFrame(w io.Writer, kind byte, p []byte) {
	var hdr [5]byte
	hdr[0] = kind
	binary.BigEndian.PutUint32(hdr[1:], uint32(len(p)))
	_, _ = w.Write(append(hdr[:], p...))
}

// TestCommandsEgressLateStream: a stream the pod's side opens after the worker closed its
// egress listener (a connection it accepted just then) is closed at once, not left in the
// backlog, where its open would time out after 75 s and yamux would end the whole session; the
// session's commands go on.
func TestCommandsEgressLateStream(t *testing.T) {
	late := make(chan error, 1)
	closed := make(chan struct{})
	c := fakePodSide(t, func(sess *yamux.Session, ctrl *yamux.Stream) {
		if _, err := bufio.NewReader(ctrl).ReadBytes('\n'); err != nil {
			late <- err
			return
		}
		writeFrame(ctrl, 3, []byte{0, 0, 0, 0}) // frameExit 0: listening
		<-closed
		st, err := sess.OpenStream()
		if err != nil {
			late <- err
			return
		}
		_, _ = io.WriteString(st, "CONNECT x:443 HTTP/1.1\r\n\r\n")
		_, err = io.ReadAll(st) // returns once the worker's side closes the stream
		late <- err
	})
	ln, err := c.Egress(t.Context())
	if err != nil {
		t.Fatalf("Egress: %v", err)
	}
	ln.Close()
	close(closed)
	select {
	case err := <-late:
		if err != nil {
			t.Errorf("the late stream: %v, want it closed by the worker's side", err)
		}
	case <-c.Done():
		t.Fatal("the session ended instead of the late stream")
	}
	select {
	case <-c.Done():
		t.Error("the session ended after the late stream")
	default:
	}
}
