//go:build integration

package sandbox_test

import (
	"context"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
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
// one does, on a bwrap of its own, not on the dead spare.
func TestBubblewrapWarmSpareKilledWhileIdle(t *testing.T) {
	t.Parallel()
	for _, goSpare := range []bool{false, true} {
		t.Run(map[bool]string{false: "shell spare", true: "Go spare"}[goSpare], func(t *testing.T) {
			t.Parallel()
			p := sandboxtest.Bubblewrap(t)
			if goSpare {
				sandbox.UseGoSpare(p)
			}
			spec := sandboxtest.Spec("", config.SandboxSpec{})
			spec.Pool, spec.Ahead = "p", time.Hour
			sb, err := p.Start(t.Context(), spec)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = sb.Close(context.Background()) })
			sandbox.AwaitWarm(sb)
			st := sandbox.BubblewrapHostState(sb)
			killed := killCgroup(t, st.Cgroups)
			if killed == 0 {
				t.Skip("no cgroup to find the spare by")
			}
			if err := sb.(sandbox.Claimer).Claim(t.Context(), "default", "job-1"); err != nil {
				t.Fatal(err)
			}
			res, err := sb.Exec(t.Context(), sandbox.ExecRequest{Argv: []string{"echo", "hello"}, Timeout: 30 * time.Second})
			if err != nil || res.ExitCode != 0 || string(res.Stdout) != "hello\n" {
				t.Errorf("the first command after the spare was killed: %v, exit %d, stdout %q, stderr %q; want hello",
					err, res.ExitCode, res.Stdout, res.Stderr)
			}
		})
	}
}

// killCgroup SIGKILLs every process in the first of the cgroups that has any (the sandbox's,
// which the test started) and waits until none is left; it returns how many it killed.
func killCgroup(t *testing.T, dirs []string) int {
	t.Helper()
	for _, d := range dirs {
		procs := func() []string {
			b, _ := os.ReadFile(filepath.Join(d, "cgroup.procs"))
			return strings.Fields(string(b))
		}
		pids := procs()
		if len(pids) == 0 {
			continue
		}
		for _, f := range pids {
			pid, _ := strconv.Atoi(f)
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
		harness.Wait(t, "the sandbox's processes gone from "+d, func() (bool, error) { return len(procs()) == 0, nil })
		return len(pids)
	}
	return 0
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
