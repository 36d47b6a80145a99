//go:build integration

package sandbox_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/boxcar-run/boxcar/internal/config"
	"github.com/boxcar-run/boxcar/internal/sandbox"
	"github.com/boxcar-run/boxcar/internal/sandbox/sandboxtest"
)

// TestBubblewrapWarmConformance runs the conformance suite on sandboxes taken warm from a pool
// while another job ran beside each: a warm sandbox behaves as a cold one.
func TestBubblewrapWarmConformance(t *testing.T) {
	sandboxtest.Run(t, func(t *testing.T) sandbox.Provider { return sandboxtest.Warm(t, sandboxtest.Bubblewrap(t)) })
}

// TestBubblewrapWarmIsolation: a warm sandbox shows nothing of the job that ran beside it
// while it waited.
func TestBubblewrapWarmIsolation(t *testing.T) {
	t.Parallel()
	sandboxtest.RunWarmIsolation(t, sandboxtest.Bubblewrap(t))
}

// TestEscapeSuiteWarm runs the escape and exhaustion suite on warm sandboxes: bounds counted
// from the claim hold as from a cold start.
func TestEscapeSuiteWarm(t *testing.T) {
	t.Parallel()
	sandboxtest.RunEscape(t, sandboxtest.Warm(t, sandboxtest.Bubblewrap(t)), sandboxtest.Host{
		WorkdirUse: func(sb sandbox.Sandbox) (int64, int64, error) {
			var st unix.Statfs_t
			if err := unix.Statfs(sandbox.BubblewrapHostState(sb).Dir, &st); err != nil {
				return 0, 0, err
			}
			return int64(st.Blocks-st.Bfree) * st.Bsize, int64(st.Files - st.Ffree), nil
		},
		PIDs: sandboxtest.EscapeSpec.PIDs,
	})
}

// TestBubblewrapWarmEgress runs the egress conformance suite on warm sandboxes: the network is
// attached after the claim, and the first command, handed to a spare bwrap started with the
// egress binds, reaches the proxy and nothing else.
func TestBubblewrapWarmEgress(t *testing.T) {
	sandboxtest.RunEgress(t, sandboxtest.Warm(t, sandboxtest.Bubblewrap(t)))
}

// TestBubblewrapWarmFirstCommandAsCold: the first command of a warm sandbox runs on the spare
// bwrap started ahead, and sees what the first command of a cold one sees: the same pid, stdio,
// environment, folder, credentials, filter, limits and root. (Its children's pids start a few
// higher: the helper's runtime threads took some; docs/sandbox.md.)
func TestBubblewrapWarmFirstCommandAsCold(t *testing.T) {
	t.Parallel()
	p := sandboxtest.Bubblewrap(t)
	const script = `echo pid=$$; for f in 0 1 2; do readlink /proc/self/fd/$f | cut -d: -f1; done; pwd; env | sort; ` +
		`grep -E '^(Uid|Gid|Groups|CapInh|CapPrm|CapEff|CapBnd|CapAmb|NoNewPrivs|Seccomp):' /proc/self/status; ulimit -a; ls -A /`
	first := func(sb sandbox.Sandbox) string {
		res, err := sb.Exec(t.Context(), sandbox.ExecRequest{Argv: []string{"sh", "-c", script}, Env: map[string]string{"JOB": "x"}, Timeout: 30 * time.Second})
		if err != nil || res.ExitCode != 0 {
			t.Fatalf("exec: %v, exit %d: %s", err, res.ExitCode, res.Stderr)
		}
		return string(res.Stdout)
	}
	cold := first(sandboxtest.StartSpec(t, p, config.SandboxSpec{}))
	spec := sandboxtest.Spec("", config.SandboxSpec{})
	spec.Pool, spec.Ahead = "p", time.Hour
	warm, err := p.Start(t.Context(), spec)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = warm.Close(context.Background()) })
	sandbox.AwaitWarm(warm)
	if err := warm.(sandbox.Claimer).Claim(t.Context(), "job-1"); err != nil {
		t.Fatal(err)
	}
	if got := first(warm); got != cold {
		t.Errorf("the warm sandbox's first command saw\n%s\nthe cold one's\n%s", got, cold)
	}
	if !sandbox.RanOnSpare(warm) {
		t.Error("the warm sandbox's first command did not run on its spare bwrap")
	}
	if sandbox.RanOnSpare(sandboxtest.StartSpec(t, p, config.SandboxSpec{})) {
		t.Error("a cold sandbox has a spare")
	}
}

// TestBubblewrapNoSpareUnderAddressLimit: where no memory cgroup bounds a sandbox, RLIMIT_AS
// does, under which the spare's Go runtime cannot start; such a sandbox starts no spare, and its
// first command starts its own bwrap.
func TestBubblewrapNoSpareUnderAddressLimit(t *testing.T) {
	t.Parallel()
	p := sandboxtest.Bubblewrap(t, func(c *sandbox.BubblewrapConfig) { c.DisableCgroups = true })
	spec := sandboxtest.Spec("", config.SandboxSpec{})
	spec.Pool, spec.Ahead = "p", time.Hour
	sb, err := p.Start(t.Context(), spec)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sb.Close(context.Background()) })
	if !strings.Contains(sb.Info().Isolation, "rlimits=") || !strings.Contains(sb.Info().Isolation, ",as") {
		t.Fatalf("the sandbox is not bounded by RLIMIT_AS: %s", sb.Info().Isolation)
	}
	sandbox.AwaitWarm(sb)
	if sandbox.HasSpare(sb) {
		t.Error("a sandbox under RLIMIT_AS started a spare bwrap")
	}
	if err := sb.(sandbox.Claimer).Claim(t.Context(), "job-1"); err != nil {
		t.Fatal(err)
	}
	res, err := sb.Exec(t.Context(), sandbox.ExecRequest{Argv: []string{"true"}, Timeout: 30 * time.Second})
	if err != nil || res.ExitCode != 0 {
		t.Fatalf("exec true: %v, exit %d: %s", err, res.ExitCode, res.Stderr)
	}
}
