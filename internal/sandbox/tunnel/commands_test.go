package tunnel_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/yamux"

	"github.com/boxcar-run/boxcar/internal/sandbox/tunnel"
)

// commandSession joins a pod's side (ServeCommands, running commands on this host) and the
// worker's over two pipes, as one exec's stdin and stdout do.
func commandSession(t *testing.T) *tunnel.Commands {
	t.Helper()
	return commandSessionWith(t, nil)
}

// commandSessionWith is commandSession whose pod side listens for egress with listen.
func commandSessionWith(t *testing.T, listen func() (net.Listener, error)) *tunnel.Commands {
	t.Helper()
	toPodR, toPodW := io.Pipe()
	fromPodR, fromPodW := io.Pipe()
	served := make(chan error, 1)
	go func() {
		served <- tunnel.ServeCommands(toPodR, fromPodW, listen)
		fromPodW.Close()
	}()
	c, err := tunnel.DialCommands(t.Context(), fromPodR, toPodW)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		c.Close()
		if err := <-served; err != nil {
			t.Errorf("pod side: %v", err)
		}
	})
	return c
}

// TestCommandsRun: each command of the session gets its stdin, its stdout and stderr apart and
// whole (past one frame), and its exit code, a signal's as 128 plus the signal, as a runtime's
// exec gives them; a program that cannot start is an error, not a code.
func TestCommandsRun(t *testing.T) {
	c := commandSession(t)
	big := strings.Repeat("x", 100_000)
	for _, tt := range []struct {
		name           string
		argv           []string
		stdin          string
		code           int
		stdout, stderr string
		failed         bool
	}{
		{name: "streams apart", argv: []string{"sh", "-c", "cat; echo err >&2; exit 3"}, stdin: "in\n", code: 3, stdout: "in\n", stderr: "err\n"},
		{name: "large output", argv: []string{"cat"}, stdin: big, stdout: big},
		{name: "no stdin", argv: []string{"sh", "-c", "cat; echo done"}, stdout: "done\n"},
		{name: "killed", argv: []string{"sh", "-c", "kill -9 $$"}, code: 137},
		{name: "no such program", argv: []string{"/nonexistent/boxcar"}, failed: true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			var stdin io.Reader
			if tt.stdin != "" {
				stdin = strings.NewReader(tt.stdin)
			}
			code, err := c.Run(t.Context(), tunnel.Command{Argv: tt.argv, Stdin: stdin, Stdout: &stdout, Stderr: &stderr})
			if tt.failed {
				if err == nil || errors.Is(err, tunnel.ErrSessionDown) {
					t.Fatalf("Run = %d, %v; want the pod side's refusal", code, err)
				}
				return
			}
			if err != nil || code != tt.code || stdout.String() != tt.stdout || stderr.String() != tt.stderr {
				t.Errorf("Run = %d, %v, stdout %d bytes %.20q, stderr %q; want %d, %d bytes, %q", code, err, stdout.Len(), stdout.String(), stderr.String(), tt.code, len(tt.stdout), tt.stderr)
			}
		})
	}
}

// TestCommandsRunStopsWaiting: ending ctx returns at once, as closing an exec's stream does;
// a session that ended sends nothing more and says so (ErrSessionDown), so the caller may run
// the command another way.
func TestCommandsRunStopsWaiting(t *testing.T) {
	c := commandSession(t)
	ctx, cancel := context.WithTimeout(t.Context(), 100*time.Millisecond)
	defer cancel()
	if _, err := c.Run(ctx, tunnel.Command{Argv: []string{"sleep", "30"}, Stdout: io.Discard, Stderr: io.Discard}); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Run past its ctx: %v, want the deadline", err)
	}
	// Nor does a writer that no longer drains, as an Open's nobody reads.
	pr, pw := io.Pipe()
	defer pr.Close()
	ctx, cancel = context.WithTimeout(t.Context(), 100*time.Millisecond)
	defer cancel()
	if _, err := c.Run(ctx, tunnel.Command{Argv: []string{"sh", "-c", "echo first; sleep 30"}, Stdout: pw, Stderr: io.Discard}); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Run into a writer nobody reads: %v, want the deadline", err)
	}
	c.Close()
	if _, err := c.Run(t.Context(), tunnel.Command{Argv: []string{"true"}, Stdout: io.Discard, Stderr: io.Discard}); !errors.Is(err, tunnel.ErrSessionDown) {
		t.Errorf("Run on a closed session: %v, want ErrSessionDown", err)
	}
}

// TestCommandsHostilePod: the pod's side is the sandbox's; a frame larger than the worker
// takes ends the command with an error instead of a buffer of the pod's choosing.
func TestCommandsHostilePod(t *testing.T) {
	c := fakePodSide(t, func(_ *yamux.Session, st *yamux.Stream) {
		var hdr [5]byte
		hdr[0] = 1
		binary.BigEndian.PutUint32(hdr[1:], 1<<30)
		_, _ = st.Write(hdr[:])
	})
	if code, err := c.Run(t.Context(), tunnel.Command{Argv: []string{"true"}, Stdout: io.Discard, Stderr: io.Discard}); err == nil || !strings.Contains(err.Error(), "frame") {
		t.Errorf("Run = %d, %v; want the oversized frame refused", code, err)
	}
}

// fakePodSide is a pod's side written by the test: it says ready, answers the worker's first
// stream with answer, and holds the session until the worker closes it.
func fakePodSide(t *testing.T, answer func(*yamux.Session, *yamux.Stream)) *tunnel.Commands {
	t.Helper()
	toPodR, toPodW := io.Pipe()
	fromPodR, fromPodW := io.Pipe()
	done := make(chan struct{})
	go func() {
		defer close(done)
		defer fromPodW.Close()
		_, _ = io.WriteString(fromPodW, "boxcar-exec-session ready\n")
		sess, err := yamux.Client(rw{toPodR, fromPodW}, nil)
		if err != nil {
			return
		}
		defer sess.Close()
		if st, err := sess.AcceptStream(); err == nil {
			answer(sess, st)
		}
		<-sess.CloseChan()
	}()
	c, err := tunnel.DialCommands(t.Context(), fromPodR, toPodW)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close(); <-done })
	return c
}

type rw struct {
	io.Reader
	io.WriteCloser
}

// TestCommandsKillMarked: once a command with a mark has ended, nothing carrying the mark is
// left, however the command left it: its own kill may have had no process slot to run in.
func TestCommandsKillMarked(t *testing.T) {
	c := commandSession(t)
	for _, tt := range []struct {
		name   string
		script string
		code   int
	}{
		{name: "left running", script: `sleep 60 </dev/null >/dev/null 2>&1 & exit 0`},
		{name: "holding the output", script: `sleep 60 & exit 0`},
		{name: "still forking", script: `(while :; do sleep 60 & sleep 0.01; done) </dev/null >/dev/null 2>&1 & exit 3`, code: 3},
	} {
		t.Run(tt.name, func(t *testing.T) {
			mark := "BOXCAR_TEST_MARK=" + strings.ReplaceAll(t.Name(), "/", "-")
			code, err := c.Run(t.Context(), tunnel.Command{Argv: []string{"env", mark, "sh", "-c", tt.script}, Mark: mark, Stdout: io.Discard, Stderr: io.Discard})
			if err != nil || code != tt.code {
				t.Fatalf("Run = %d, %v; want %d", code, err, tt.code)
			}
			if left := carrying(mark); len(left) > 0 {
				t.Errorf("processes %v still carry %s after the command ended", left, mark)
				killAll(left)
			}
		})
	}
}

// carrying lists the processes whose environment holds mark.
func carrying(mark string) []int {
	return procsWhere("environ", func(env []byte) bool { return slices.Contains(strings.Split(string(env), "\x00"), mark) })
}

// procsWhere lists the processes whose /proc/PID/file (as read now) keep accepts; a process
// gone meanwhile reads as empty.
func procsWhere(file string, keep func(data []byte) bool) []int {
	entries, _ := os.ReadDir("/proc")
	var pids []int
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		data, _ := os.ReadFile("/proc/" + e.Name() + "/" + file)
		if keep(data) {
			pids = append(pids, pid)
		}
	}
	return pids
}
