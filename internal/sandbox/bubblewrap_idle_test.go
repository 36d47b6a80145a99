//go:build integration

package sandbox_test

import (
	"fmt"
	"regexp"
	"syscall"
	"testing"
	"time"

	"github.com/boxcar-run/boxcar/internal/config"
	"github.com/boxcar-run/boxcar/internal/sandbox"
	"github.com/boxcar-run/boxcar/internal/sandbox/sandboxtest"
	"github.com/boxcar-run/boxcar/test/harness"
)

// TestBubblewrapWarmSpareKilledWhileIdle: a warm sandbox whose spare bwrap was killed while it
// waited for a job (the host's OOM killer, an operator) runs its job's first command as a cold
// one does, on a bwrap of its own, not on the dead spare. The spare is found by its pid, so the
// test runs with cgroups and without.
func TestBubblewrapWarmSpareKilledWhileIdle(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name               string
		goSpare, noCgroups bool
		noSpare            bool // bounded by RLIMIT_AS, the Go spare's runtime would crash: none starts
	}{
		{name: "shell spare"},
		{name: "Go spare", goSpare: true},
		{name: "shell spare, no cgroups", noCgroups: true},
		{name: "Go spare, no cgroups: none", goSpare: true, noCgroups: true, noSpare: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			sb := startAhead(t, spareBubblewrap(t, tt.goSpare, tt.noCgroups), "")
			sandbox.AwaitWarm(sb)
			switch pid := sandbox.SparePid(sb); {
			case tt.noSpare && pid != 0:
				t.Fatalf("a spare bwrap (pid %d) started where none can run", pid)
			case !tt.noSpare && pid == 0:
				t.Fatal("the warm sandbox has no spare bwrap to kill")
			case pid != 0:
				killTree(t, pid)
			}
			if err := sb.(sandbox.Claimer).Claim(t.Context(), "default", "job-1"); err != nil {
				t.Fatal(err)
			}
			res, err := sb.Exec(t.Context(), sandbox.ExecRequest{Argv: []string{"echo", "hello"}, Timeout: 30 * time.Second})
			if err != nil || res.ExitCode != 0 || string(res.Stdout) != "hello\n" {
				t.Errorf("the first command after the spare was killed: %v, exit %d, stdout %q, stderr %q; want hello",
					err, res.ExitCode, res.Stdout, res.Stderr)
			}
			if sandbox.RanOnSpare(sb) {
				t.Error("the first command ran on the killed spare")
			}
		})
	}
}

// killTree SIGKILLs the process pid and every descendant of it (read from /proc, before any
// is killed, so that none is left an orphan that escapes the walk), and waits until each has
// exited: gone, or a zombie its parent has not reaped yet.
func killTree(t *testing.T, pid int) {
	t.Helper()
	pids := harness.ProcessTree(pid)
	for _, p := range pids {
		_ = syscall.Kill(p, syscall.SIGKILL)
	}
	for _, p := range pids {
		harness.Wait(t, fmt.Sprintf("process %d exited", p), func() (bool, error) {
			st := harness.ProcStat(p)
			return st == nil || st[0] == "Z" || st[0] == "X", nil
		})
	}
}

// TestBubblewrapWarmInfoAsCold: what a claimed warm sandbox says of itself, which the
// manifest records, is what a cold one of the same spec says, but for its id.
func TestBubblewrapWarmInfoAsCold(t *testing.T) {
	t.Parallel()
	p := sandboxtest.Bubblewrap(t)
	cold := sandboxtest.StartSpec(t, p, config.SandboxSpec{}).Info()
	warm := startClaimed(t, p).Info()
	// Its own, as every sandbox's id and host uid are.
	hostUID := regexp.MustCompile(`host_uid=[0-9]+`)
	warm.ID, warm.Isolation = cold.ID, hostUID.ReplaceAllString(warm.Isolation, "host_uid=N")
	cold.Isolation = hostUID.ReplaceAllString(cold.Isolation, "host_uid=N")
	if warm != cold {
		t.Errorf("a claimed warm sandbox says %+v; a cold one %+v", warm, cold)
	}
}
