package tunnel_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/boxcar-run/boxcar/internal/sandbox/tunnel"
	"github.com/boxcar-run/boxcar/internal/spawn"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m, goleak.IgnoreAnyFunction(spawn.StarterFunc)) }

// pair is both ends of a tunnel over an in-memory pipe, as the pod's side and the worker's
// side see the exec's stdin and stdout: the pod's side listens on the test's loopback.
type pair struct {
	addr    string       // where the pod's side listens
	ln      net.Listener // the worker's side
	podDone chan error
}

func newPair(t *testing.T) *pair {
	t.Helper()
	podEnd, workerEnd := net.Pipe()
	podLn, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &pair{addr: podLn.Addr().String(), podDone: make(chan error, 1)}
	go func() {
		p.podDone <- tunnel.Pod(podLn, podEnd, podEnd)
		podEnd.Close()
	}()
	p.ln, err = tunnel.Listen(t.Context(), workerEnd, workerEnd)
	if err != nil {
		t.Fatalf("Listen: %v", err)
	}
	t.Cleanup(func() {
		p.ln.Close()
		if err := <-p.podDone; err != nil {
			t.Errorf("the pod's side ended with %v", err)
		}
	})
	return p
}

// echo answers each connection the worker's side accepts with "got " and what it read up to
// the client's half close, then closes.
func (p *pair) echo(t *testing.T) *sync.WaitGroup {
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := p.ln.Accept()
			if err != nil {
				return
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer c.Close()
				data, err := io.ReadAll(c)
				if err != nil {
					t.Errorf("worker read: %v", err)
					return
				}
				_, _ = c.Write(append([]byte("got "), data...))
			}()
		}
	}()
	return &wg
}

func ask(t *testing.T, addr, msg string) string {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatalf("dial the pod's side: %v", err)
	}
	defer c.Close()
	if _, err := io.WriteString(c, msg); err != nil {
		t.Fatal(err)
	}
	if err := c.(*net.TCPConn).CloseWrite(); err != nil {
		t.Fatal(err)
	}
	got, err := io.ReadAll(c)
	if err != nil {
		t.Fatalf("read the answer: %v", err)
	}
	return string(got)
}

func TestTunnelCarriesConnections(t *testing.T) {
	p := newPair(t)
	wg := p.echo(t)
	defer wg.Wait()
	defer p.ln.Close()

	t.Run("one, with a half close", func(t *testing.T) {
		if got := ask(t, p.addr, "ping"); got != "got ping" {
			t.Errorf("answer %q, want %q", got, "got ping")
		}
	})
	t.Run("many at once", func(t *testing.T) {
		var cwg sync.WaitGroup
		for i := range 20 {
			cwg.Add(1)
			go func() {
				defer cwg.Done()
				msg := fmt.Sprintf("client %d %s", i, make([]byte, 100_000)) // past yamux's window
				if got := ask(t, p.addr, msg); got != "got "+msg {
					t.Errorf("client %d: answer of %d bytes, want %d", i, len(got), len(msg)+4)
				}
			}()
		}
		cwg.Wait()
	})
}

func TestTunnelClosedByTheWorker(t *testing.T) {
	p := newPair(t)
	if err := p.ln.Close(); err != nil {
		t.Fatal(err)
	}
	if err := <-p.podDone; err != nil {
		t.Fatalf("the pod's side ended with %v, want nil", err)
	}
	p.podDone <- nil // for the cleanup
	// The pod's side stopped listening: a command's client is refused, not left hanging.
	if c, err := net.Dial("tcp", p.addr); err == nil {
		c.Close()
		t.Error("the pod's side still listens after the worker closed the tunnel")
	}
}

func TestTunnelConnCloseEndsItsReads(t *testing.T) {
	p := newPair(t)
	client, err := net.Dial("tcp", p.addr)
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	c, err := p.ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	read := make(chan error, 1)
	go func() {
		_, err := c.Read(make([]byte, 1))
		read <- err
	}()
	c.Close() // as the proxy closes a connection it refused while another goroutine reads
	if err := <-read; err == nil {
		t.Error("a read on a closed connection returned data")
	}
	// The client sees its connection end.
	if _, err := io.ReadAll(client); err != nil && !errors.Is(err, io.EOF) {
		t.Logf("client read ended with %v", err)
	}
}

func TestTunnelListenRefuses(t *testing.T) {
	for _, tt := range []struct {
		name string
		pod  func(io.Writer)
	}{
		{"something other than ready", func(w io.Writer) { _, _ = io.WriteString(w, "HTTP/1.1 200 OK\n") }},
		{"ended before ready", func(io.Writer) {}},
		{"no newline within the bound", func(w io.Writer) { _, _ = w.Write(make([]byte, 300)) }},
	} {
		t.Run(tt.name, func(t *testing.T) {
			podEnd, workerEnd := net.Pipe()
			go func() {
				tt.pod(podEnd)
				podEnd.Close()
			}()
			ln, err := tunnel.Listen(t.Context(), workerEnd, workerEnd)
			if !errors.Is(err, tunnel.ErrNotReady) {
				if ln != nil {
					ln.Close()
				}
				t.Fatalf("Listen: %v, want ErrNotReady", err)
			}
		})
	}
	t.Run("silent until ctx ends", func(t *testing.T) {
		podEnd, workerEnd := net.Pipe()
		defer podEnd.Close()
		ctx, cancel := context.WithTimeout(t.Context(), 50*time.Millisecond)
		defer cancel()
		if _, err := tunnel.Listen(ctx, workerEnd, workerEnd); !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("Listen: %v, want the ctx's deadline", err)
		}
	})
}
