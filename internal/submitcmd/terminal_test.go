package submitcmd

import (
	"encoding/json"
	"errors"
	"io"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/creack/pty"

	"github.com/boxcar-run/boxcar/internal/job"
	"github.com/boxcar-run/boxcar/test/harness"
)

// TestWatchOnATerminal runs `submit watch` on a pseudo-terminal: it draws one block and
// redraws it in place as the job moves on (the cursor goes back up over the block), and
// Ctrl-C ends it with exit 130, saying the job keeps running.
func TestWatchOnATerminal(t *testing.T) {
	te := newTestEnv(t)
	te.advertise(t)
	id := te.submitJob(t)
	args, _ := json.Marshal([]string{"watch", id})
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), asSubmit+"="+string(args), "NATS_URL="+te.natsURL, "BOXCAR_HOME="+te.home)
	tty, err := pty.StartWithSize(cmd, &pty.Winsize{Rows: 40, Cols: 200})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = tty.Close() })
	var screen harness.LogBuffer
	copied := make(chan struct{})
	go func() {
		defer close(copied)
		_, _ = io.Copy(&screen, tty) // ends with EIO once the command exits
	}()
	exited := make(chan error, 1)
	var ended atomic.Bool
	go func() {
		err := cmd.Wait()
		ended.Store(true)
		exited <- err
	}()
	t.Cleanup(func() {
		if !ended.Load() {
			_ = cmd.Process.Kill()
		}
	})

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

	if _, err := tty.Write([]byte{3}); err != nil { // Ctrl-C, as a person types it
		t.Fatal(err)
	}
	err = <-exited
	<-copied
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
