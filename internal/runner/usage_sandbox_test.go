//go:build integration

package runner_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/boxcar-run/boxcar/internal/agent"
	"github.com/boxcar-run/boxcar/internal/job"
	"github.com/boxcar-run/boxcar/internal/runner"
	"github.com/boxcar-run/boxcar/internal/sandbox"
	"github.com/boxcar-run/boxcar/internal/sandbox/sandboxtest"
)

// TestManifestSandboxUsage runs a job in a real bubblewrap sandbox whose command holds 30 MB
// and burns CPU: the manifest's usage record has the sandbox's peak memory from its cgroup (at
// least those 30 MB) and its CPU time, or names what the host's cgroups cannot count.
func TestManifestSandboxUsage(t *testing.T) {
	t.Parallel()
	b := setup(t)
	const burn = `i=0; while [ $i -lt 300000 ]; do i=$((i+1)); done; x=$(head -c 30000000 /dev/zero | tr '\0' a); echo ${#x} > report.md`
	b.worker(agentFunc(func(ctx context.Context, req agent.Request) (agent.Result, error) {
		res, err := req.Sandbox.Exec(ctx, sandbox.ExecRequest{Argv: []string{"sh", "-c", burn}, Timeout: time.Minute})
		if err != nil || res.ExitCode != 0 {
			t.Errorf("exec: %v, exit %d: %s", err, res.ExitCode, res.Stderr)
		}
		return agent.Result{Outcome: agent.OutcomeCompleted}, nil
	}), func(c *runner.Config) { c.Sandboxes = sandboxtest.Bubblewrap(t) })
	j := b.submit("p")
	if st := b.waitFinal(j.ID, time.Minute); st.State != job.StateSucceeded {
		t.Fatalf("%s: %s", st.State, st.Error)
	}
	s := b.manifest(j.ID).Predicate.Usage.Sandbox
	if s == nil {
		t.Fatal("no sandbox usage in the manifest")
	}
	t.Logf("sandbox usage: %+v", *s)
	missing := strings.Join(s.Missing, "; ")
	if s.PeakMemoryBytes < 30_000_000 && !strings.Contains(missing, "memory:") {
		t.Errorf("peak memory %d bytes, want at least the 30 MB the command held, or why it is missing", s.PeakMemoryBytes)
	}
	if s.CPUMS <= 0 && !strings.Contains(missing, "cpu:") {
		t.Errorf("cpu %d ms, want some, or why it is missing", s.CPUMS)
	}
	if s.Source == "" && !strings.Contains(missing, "no cgroup") {
		t.Errorf("no source, and the record does not say the sandbox had no cgroup: %s", missing)
	}
}
