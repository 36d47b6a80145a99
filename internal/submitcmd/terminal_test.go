package submitcmd

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/creack/pty"

	"github.com/boxcar-run/boxcar/internal/job"
	"github.com/boxcar-run/boxcar/internal/queue"
	"github.com/boxcar-run/boxcar/test/harness"
)

// TestWatchOnATerminal runs `submit watch` on a pseudo-terminal: it draws one block and
// redraws it in place as the job moves on (the cursor goes back up over the block), says in
// the block while NATS is lost, and Ctrl-C ends it with exit 130, saying the job keeps running.
func TestWatchOnATerminal(t *testing.T) {
	te := newTestEnv(t)
	te.advertise(t)
	id := te.submitJob(t)
	term := te.startTerminal(t, []string{"watch", id}, &pty.Winsize{Rows: 40, Cols: 200})
	screen, ended := &term.screen, &term.ended

	waitFor(t, "the block for the queued job", func() bool { return strings.Contains(screen.String(), "job "+id+"  queued") })
	te.setState(t, id, func(s *job.Status) {
		// As a worker's claim writes it: the profile too (submit writes no status).
		s.State, s.Attempt, s.Worker, s.Profile, s.Progress = job.StateRunning, 1, "worker-1", "csv-analyst", "tool call 3 of 30: csv_stats"
		s.SpentTurns, s.SpentToolCalls, s.SpentTokens = 2, 3, 1500
	})
	// "turns 2/N": the profile's cap, from what the workers publish. The terminal ends each
	// line with \r\n.
	redrawn := regexp.MustCompile(`\r\x1b\[\d+A\x1b\[Jjob ` + id + `  running \(attempt 1 on worker-1\)[^\n]*\n  tool call 3 of 30: csv_stats\r\n  turns 2/\d+   tool calls 3/\d+   tokens 1500/\d+\r\n`)
	waitFor(t, "the block redrawn in place for the running job", func() bool {
		if redrawn.MatchString(screen.String()) {
			return true
		}
		if ended.Load() {
			t.Fatalf("watch ended: %q", screen.String())
		}
		return false
	})
	if regexp.MustCompile(`\d\d:\d\d:\d\d  (queued|running)`).MatchString(screen.String()) {
		t.Errorf("watch on a terminal printed progress lines, not a block:\n%q", screen.String())
	}

	// NATS lost: the block says so as a line of its own, redrawn with it (a line printed below
	// the block would be drawn over within a second), and goes on once NATS answers again.
	te.ns.Shutdown()
	lost := regexp.MustCompile(`\x1b\[Jjob ` + id + `[^\x1b]*\r\n  lost NATS at [^\x1b]*; the job runs on\r\n`)
	waitFor(t, "the block to say NATS is lost", func() bool { return lost.MatchString(screen.String()) })
	te.restart(t)
	back := len(screen.String())
	waitFor(t, "the block without the word once NATS answers", func() bool {
		s := screen.String()[back:]
		i := strings.LastIndex(s, "\x1b[J")
		return i >= 0 && strings.Contains(s[i:], "turns 2/") && !strings.Contains(s[i:], "lost NATS")
	})

	if _, err := term.tty.Write([]byte{3}); err != nil { // Ctrl-C, as a person types it
		t.Fatal(err)
	}
	err := term.wait()
	var exit *exec.ExitError
	if !errors.As(err, &exit) || exit.ExitCode() != exitInterrupted {
		t.Fatalf("watch after Ctrl-C: %v; want exit %d\n%q", err, exitInterrupted, screen.String())
	}
	if !strings.Contains(screen.String(), "job "+id+" keeps running") {
		t.Errorf("watch after Ctrl-C does not say the job keeps running:\n%q", screen.String())
	}
	st, err := te.q.Status(t.Context(), ref(id))
	if err != nil || st.State != job.StateRunning {
		t.Errorf("the job after Ctrl-C: %v, %v; want it still running", st.State, err)
	}
}

// TestApproveAsksFirst: approve and deny show the command, then ask y/N on a terminal and sign
// only on y or yes; anything else signs nothing and exits 10. Without a terminal they sign only
// with --yes, and say so: they signed whatever stdin held without asking.
func TestApproveAsksFirst(t *testing.T) {
	te := newTestEnv(t)
	id := te.submitJob(t)
	now := time.Now().UTC()
	for _, call := range []string{"call_1", "call_2"} {
		if _, err := te.q.RequestApproval(t.Context(), queue.Approval{Tenant: "default", JobID: id, CallID: call, Argv: []string{"rm", "-rf", "/work"}, RequestedAt: now, ExpiresAt: now.Add(time.Hour)}); err != nil {
			t.Fatal(err)
		}
	}
	pending := func() int {
		list, _, err := te.c.PendingApprovals(t.Context(), id)
		if err != nil {
			t.Fatal(err)
		}
		return len(list)
	}

	for _, args := range [][]string{{"approve", id, "call_1"}, {"deny", id, "call_1", "--reason", "no"}} {
		var stdout, stderr bytes.Buffer
		err := run(t.Context(), &env{getenv: te.getenv, stdin: strings.NewReader("y\n"), stdout: &stdout, stderr: &stderr, publish: defaultPublishPolicy}, args)
		if exitCode(err) != 1 || !strings.Contains(message(err), "--yes") || pending() != 2 {
			t.Errorf("%s from a pipe without --yes: exit %d, %q, %d pending; want exit 1 asking for --yes, nothing signed", args[0], exitCode(err), message(err), pending())
		}
	}

	tests := []struct {
		name, answer string
		args         []string
		code         int
		pending      int
	}{
		{name: "enter", answer: "\r", args: []string{"approve", id, "call_1"}, code: exitNotConfirmed, pending: 2},
		{name: "n", answer: "n\r", args: []string{"deny", id, "call_1"}, code: exitNotConfirmed, pending: 2},
		{name: "yes", answer: "yes\r", args: []string{"approve", id, "call_1"}, code: 0, pending: 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			screen, code := te.onTerminal(t, tt.args, "[y/N]", tt.answer)
			if code != tt.code || pending() != tt.pending || !strings.Contains(screen, `["rm","-rf","/work"]`) {
				t.Errorf("%s answered %q: exit %d, %d pending; want exit %d, %d pending, the command shown\n%q", tt.args[0], tt.answer, code, pending(), tt.code, tt.pending, screen)
			}
		})
	}

	stdout, _, err := te.submit(t, "deny", id, "call_2", "--yes")
	if err != nil || !strings.Contains(stdout, "denied call call_2") || pending() != 0 {
		t.Errorf("deny --yes from a pipe: %v, %d pending\n%s", err, pending(), stdout)
	}
}

// onTerminal runs submit with args on a pseudo-terminal, types answer once prompt shows and
// returns what the terminal showed and the exit code.
func (te *testEnv) onTerminal(t *testing.T, args []string, prompt, answer string) (string, int) {
	t.Helper()
	term := te.startTerminal(t, args, nil)
	waitFor(t, "the prompt", func() bool { return strings.Contains(term.screen.String(), prompt) || term.ended.Load() })
	if !term.ended.Load() {
		if _, err := term.tty.Write([]byte(answer)); err != nil {
			t.Fatal(err)
		}
	}
	err := term.wait()
	var exit *exec.ExitError
	if err != nil && !errors.As(err, &exit) {
		t.Fatal(err)
	}
	return term.screen.String(), term.cmd.ProcessState.ExitCode()
}

// terminal is submit running on a pseudo-terminal: what it has shown, and its end.
type terminal struct {
	cmd    *exec.Cmd
	tty    *os.File
	screen harness.LogBuffer
	copied chan struct{} // closed once screen holds all the command showed
	exited chan error
	ended  atomic.Bool
}

// startTerminal runs submit with args on a pseudo-terminal of size (nil: the default size),
// killed at the end of the test if it still runs.
func (te *testEnv) startTerminal(t *testing.T, args []string, size *pty.Winsize) *terminal {
	t.Helper()
	raw, _ := json.Marshal(args)
	term := &terminal{cmd: exec.Command(os.Args[0], "-test.run=^$"), copied: make(chan struct{}), exited: make(chan error, 1)}
	term.cmd.Env = append(os.Environ(), asSubmit+"="+string(raw), "NATS_URL="+te.natsURL, "BOXCAR_HOME="+te.home)
	tty, err := pty.StartWithSize(term.cmd, size)
	if err != nil {
		t.Fatal(err)
	}
	term.tty = tty
	t.Cleanup(func() { _ = tty.Close() })
	go func() {
		defer close(term.copied)
		_, _ = io.Copy(&term.screen, tty) // ends with EIO once the command exits
	}()
	go func() {
		err := term.cmd.Wait()
		term.ended.Store(true)
		term.exited <- err
	}()
	t.Cleanup(func() {
		if !term.ended.Load() {
			_ = term.cmd.Process.Kill()
		}
	})
	return term
}

// wait is the command's end, once the terminal has shown all it printed.
func (term *terminal) wait() error {
	err := <-term.exited
	<-term.copied
	return err
}
