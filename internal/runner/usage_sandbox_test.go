//go:build integration

package runner_test

import (
	"context"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/boxcar-run/boxcar/internal/agent"
	"github.com/boxcar-run/boxcar/internal/config"
	"github.com/boxcar-run/boxcar/internal/job"
	"github.com/boxcar-run/boxcar/internal/pool"
	"github.com/boxcar-run/boxcar/internal/provenance"
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
	b.worker(agentFunc(func(ctx context.Context, req agent.Request) (agent.Result, error) {
		res, err := req.Sandbox.Exec(ctx, sandbox.ExecRequest{Argv: []string{"sh", "-c", usageBurn}, Timeout: time.Minute})
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
	checkSandboxUsage(t, s)
}

const usageBurn = `i=0; while [ $i -lt 300000 ]; do i=$((i+1)); done; x=$(head -c 30000000 /dev/zero | tr '\0' a); echo ${#x} > report.md`

// checkSandboxUsage asks of a manifest's sandbox usage what usageBurn makes a bubblewrap
// sandbox count: at least its 30 MB and some CPU, or the reason the host's cgroups cannot.
func checkSandboxUsage(t *testing.T, s *provenance.SandboxUsage) {
	t.Helper()
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

type noLag struct{}

func (noLag) Lags(context.Context) ([]pool.Lag, error) { return nil, nil }

// TestManifestSandboxUsageThroughPool is TestManifestSandboxUsage on a worker with a warm pool,
// as workercmd wires one whenever a profile is warm: every job's sandbox then comes through
// Pool.Take, warm or cold, wrapped. The manifest still has the bubblewrap sandbox's cgroup
// figures (the wrapper once hid them: "the bubblewrap backend does not count them").
func TestManifestSandboxUsageThroughPool(t *testing.T) {
	t.Parallel()
	for _, warm := range []bool{true, false} {
		name := map[bool]string{true: "warm profile", false: "cold take through the pool"}[warm]
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			bw := sandboxtest.Bubblewrap(t)
			profiles := map[string]config.Profile{}
			for n, p := range b.cfg.Profiles {
				if warm && n == "p" {
					p.Warm = &config.Warm{Min: 1, Idle: config.Duration(time.Hour), MaxAge: config.Duration(time.Hour)}
				}
				profiles[n] = p
			}
			if !warm { // another profile is warm: p's jobs go through the pool, cold
				profiles["other"] = config.Profile{Sandbox: profiles["p"].Sandbox, Warm: &config.Warm{Idle: config.Duration(time.Hour), MaxAge: config.Duration(time.Hour)}}
			}
			m := pool.NewMetrics(nil)
			pl, err := pool.New(pool.Config{Provider: bw, Profiles: profiles, Slots: 2, Lag: noLag{}, Metrics: m, Logger: slog.New(slog.DiscardHandler)})
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan struct{})
			go func() { defer close(done); _ = pl.Run(ctx) }()
			t.Cleanup(func() { cancel(); <-done })
			b.worker(agentFunc(func(ctx context.Context, req agent.Request) (agent.Result, error) {
				res, err := req.Sandbox.Exec(ctx, sandbox.ExecRequest{Argv: []string{"sh", "-c", usageBurn}, Timeout: time.Minute})
				if err != nil || res.ExitCode != 0 {
					t.Errorf("exec: %v, exit %d: %s", err, res.ExitCode, res.Stderr)
				}
				return agent.Result{Outcome: agent.OutcomeCompleted}, nil
			}), func(c *runner.Config) { c.Sandboxes = bw; c.Pool = pl })
			if warm {
				waitFor(t, 30*time.Second, "the pool's warm sandbox", func() bool { return testutil.ToFloat64(m.Size.WithLabelValues("p")) == 1 })
			}
			j := b.submit("p")
			if st := b.waitFinal(j.ID, time.Minute); st.State != job.StateSucceeded {
				t.Fatalf("%s: %s", st.State, st.Error)
			}
			mf := b.manifest(j.ID).Predicate
			if mf.Sandbox.Warm != warm {
				t.Fatalf("the job's sandbox was warm %v, want %v", mf.Sandbox.Warm, warm)
			}
			s := mf.Usage.Sandbox
			if s == nil {
				t.Fatal("no sandbox usage in the manifest")
			}
			t.Logf("sandbox usage: %+v", *s)
			checkSandboxUsage(t, s)
		})
	}
}
