package tunnel_test

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/boxcar-run/boxcar/internal/sandbox/tunnel"
	"github.com/boxcar-run/boxcar/test/harness"
)

// podSession starts this test binary as a pod's command session (the package's init runs
// CommandsArg before any test does), in a process of its own as in a pod, where it makes
// itself a child subreaper. It returns the session and its pid.
func podSession(t *testing.T) (*tunnel.Commands, int) {
	t.Helper()
	cmd := exec.Command(os.Args[0], tunnel.CommandsArg)
	stdin, err := cmd.StdinPipe()
	must(t, err)
	stdout, err := cmd.StdoutPipe()
	must(t, err)
	cmd.Stderr = os.Stderr
	must(t, cmd.Start())
	c, err := tunnel.DialCommands(t.Context(), stdout, stdin)
	if err != nil {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		t.Fatal(err)
	}
	t.Cleanup(func() {
		c.Close()
		stdin.Close()
		if err := cmd.Wait(); err != nil {
			t.Errorf("command session: %v", err)
		}
	})
	return c, cmd.Process.Pid
}

// runNative runs script with sh as the session starts a job's command (Exec), under nonce.
func runNative(ctx context.Context, c *tunnel.Commands, nonce, script string, timeout time.Duration) (int, error) {
	return c.Run(ctx, tunnel.Command{
		Argv: []string{"false"}, Mark: "BOXCAR_EXEC=" + nonce, Stdout: io.Discard, Stderr: io.Discard,
		Exec: &tunnel.Exec{Argv: []string{"sh", "-c", script}, Dir: os.TempDir(), Env: []string{"PATH=/usr/bin:/bin"}, Timeout: timeout, Nonce: nonce},
	})
}

// TestCommandsKillTreeWithoutTheMark: a command's processes that shed its mark (env -i, env -u)
// or left its tree (a double fork, setsid) are killed with it, at its end and at its timeout:
// the session finds them beneath the command, or orphaned to it as the subreaper it is in a pod.
// Nothing is left as a zombie for the pod's process bound.
func TestCommandsKillTreeWithoutTheMark(t *testing.T) {
	c, session := podSession(t)
	const quiet = "</dev/null >/dev/null 2>&1"
	for _, tt := range []struct {
		name    string
		timeout time.Duration
		script  string
	}{
		{"env -i, at the end", 0, "env -i sleep 100.%[1]s " + quiet + " & sleep 0.3"},
		{"env -u, at the end", 0, "env -u BOXCAR_EXEC sleep 100.%[1]s " + quiet + " & sleep 0.3"},
		{"env -i, at the timeout", 300 * time.Millisecond, "env -i sleep 100.%[1]s " + quiet + " & sleep 60"},
		{"env -u, at the timeout", 300 * time.Millisecond, "env -u BOXCAR_EXEC sleep 100.%[1]s " + quiet + " & sleep 60"},
		{"double fork, at the end", 0, "(env -i sh -c 'sleep 100.%[1]s & sleep 100.%[1]s' " + quiet + " &); sleep 0.3"},
		{"double fork, at the timeout", 300 * time.Millisecond, "(env -i sh -c 'sleep 100.%[1]s & sleep 100.%[1]s' " + quiet + " &); sleep 60"},
		{"setsid, at the end", 0, "env -i setsid sleep 100.%[1]s " + quiet + " & sleep 0.3"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			marker := strconv.FormatInt(time.Now().UnixNano()%1_000_000_000, 10)
			code, err := runNative(t.Context(), c, "n"+marker, fmt.Sprintf(tt.script, marker), tt.timeout)
			if err != nil {
				t.Fatal(err)
			}
			if tt.timeout > 0 && code != 137 {
				t.Errorf("exit code %d, want 137 (killed at the timeout)", code)
			}
			if left := running("100." + marker); len(left) > 0 {
				t.Errorf("processes %v of the command left running", left)
				killAll(left)
			}
		})
	}
	// The kill reaps what it killed; one more command's reaps what died after that.
	if _, err := runNative(t.Context(), c, "last", "true", 0); err != nil {
		t.Fatal(err)
	}
	if z := zombies(session); len(z) > 0 {
		t.Errorf("zombie children %v of the session", z)
	}
}

// TestCommandsKillSparesAnotherCommand: two commands of a session overlap. The end of one
// kills what it orphaned, but nothing of the other still running: neither a process beneath
// it that shed its mark, nor an orphan of it that carries its mark. Its own end kills both.
func TestCommandsKillSparesAnotherCommand(t *testing.T) {
	c, _ := podSession(t)
	marker := strconv.FormatInt(time.Now().UnixNano()%1_000_000_000, 10)
	done := filepath.Join(t.TempDir(), "done")
	ran := make(chan error, 1)
	go func() {
		// 1001: beneath the first command, without its mark; 1002: orphaned, with it.
		_, err := runNative(t.Context(), c, "a"+marker, fmt.Sprintf("env -u BOXCAR_EXEC sleep 1001.%[1]s & (sleep 1002.%[1]s &); until [ -e %[2]s ]; do sleep 0.05; done", marker, done), 0)
		ran <- err
	}()
	first := func() []int { return append(sleeping("1001."+marker), sleeping("1002."+marker)...) }
	harness.Wait(t, "the first command to start", func() (bool, error) {
		running := first()
		return len(running) >= 2, fmt.Errorf("running %v", running)
	}, harness.Within(5*time.Second))
	if _, err := runNative(t.Context(), c, "b"+marker, fmt.Sprintf("env -i sleep 1003.%s </dev/null >/dev/null 2>&1 & sleep 0.3", marker), 0); err != nil {
		t.Fatal(err)
	}
	if left := running("1003." + marker); len(left) > 0 {
		t.Errorf("processes %v of the second command left running", left)
		killAll(left)
	}
	for _, which := range []string{"1001.", "1002."} {
		if len(sleeping(which+marker)) == 0 {
			t.Errorf("the second command's end killed the first's process sleep %s%s", which, marker)
		}
	}
	must(t, os.WriteFile(done, nil, 0o644))
	if err := <-ran; err != nil {
		t.Fatal(err)
	}
	if left := first(); len(left) > 0 {
		t.Errorf("processes %v of the first command left running after its end", left)
		killAll(left)
	}
}

// running lists the processes whose command line holds s.
func running(s string) []int {
	return procsWhere("cmdline", func(cmdline []byte) bool { return bytes.Contains(cmdline, []byte(s)) })
}

// sleeping lists the processes that run `sleep arg`.
func sleeping(arg string) []int {
	var pids []int
	for _, pid := range running(arg) {
		cmdline, _ := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/cmdline")
		if string(cmdline) == "sleep\x00"+arg+"\x00" {
			pids = append(pids, pid)
		}
	}
	return pids
}

func killAll(pids []int) {
	for _, pid := range pids {
		_ = syscall.Kill(pid, syscall.SIGKILL)
	}
}

// zombies lists the children of parent that have exited and not been reaped.
func zombies(parent int) []int {
	return procsWhere("stat", func(stat []byte) bool {
		if len(stat) == 0 {
			return false
		}
		fields := strings.Fields(string(stat[bytes.LastIndexByte(stat, ')')+1:]))
		return len(fields) > 1 && fields[0] == "Z" && fields[1] == strconv.Itoa(parent)
	})
}
