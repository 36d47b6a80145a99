//go:build integration

package runner_test

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/boxcar-run/boxcar/internal/agent"
	"github.com/boxcar-run/boxcar/internal/config"
	"github.com/boxcar-run/boxcar/internal/job"
	"github.com/boxcar-run/boxcar/internal/pool"
	"github.com/boxcar-run/boxcar/internal/runner"
	"github.com/boxcar-run/boxcar/internal/sandbox"
	"github.com/boxcar-run/boxcar/internal/sandbox/sandboxtest"
)

type auditNoLag struct{}

func (auditNoLag) Lags(context.Context) ([]pool.Lag, error) { return nil, nil }

// TestAuditPoolManifestUsageThroughPool is TestManifestSandboxUsage on a worker with a warm
// pool (internal/pool, as workercmd wires it whenever a profile has `warm`): every job's
// sandbox then comes through Pool.Take, warm or cold. The manifest's usage record must still
// have the bubblewrap sandbox's cgroup figures; the pool's wrapper (heldSandbox) hides the
// backend's Usage method, so the record says the bubblewrap backend does not count them.
func TestAuditPoolManifestUsageThroughPool(t *testing.T) {
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
			if !warm {
				// Another profile is warm: p's jobs go through the pool, cold.
				w := config.Profile{Sandbox: profiles["p"].Sandbox, Warm: &config.Warm{Idle: config.Duration(time.Hour), MaxAge: config.Duration(time.Hour)}}
				profiles["other"] = w
			}
			pl, err := pool.New(pool.Config{Provider: bw, Profiles: profiles, Slots: 2, Lag: auditNoLag{}, Logger: slog.New(slog.DiscardHandler)})
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan struct{})
			go func() { defer close(done); _ = pl.Run(ctx) }()
			t.Cleanup(func() { cancel(); <-done })

			const burn = `i=0; while [ $i -lt 300000 ]; do i=$((i+1)); done; x=$(head -c 30000000 /dev/zero | tr '\0' a); echo ${#x} > report.md`
			b.worker(agentFunc(func(ctx context.Context, req agent.Request) (agent.Result, error) {
				res, err := req.Sandbox.Exec(ctx, sandbox.ExecRequest{Argv: []string{"sh", "-c", burn}, Timeout: time.Minute})
				if err != nil || res.ExitCode != 0 {
					t.Errorf("exec: %v, exit %d: %s", err, res.ExitCode, res.Stderr)
				}
				return agent.Result{Outcome: agent.OutcomeCompleted}, nil
			}), func(c *runner.Config) { c.Sandboxes = bw; c.Pool = pl })
			if warm {
				time.Sleep(2 * time.Second) // let the pool's one warm sandbox start (its size is not what is asserted)
			}
			j := b.submit("p")
			if st := b.waitFinal(j.ID, time.Minute); st.State != job.StateSucceeded {
				t.Fatalf("%s: %s", st.State, st.Error)
			}
			m := b.manifest(j.ID).Predicate
			s := m.Usage.Sandbox
			if s == nil {
				t.Fatal("no sandbox usage in the manifest")
			}
			t.Logf("sandbox warm %v; usage: %+v", m.Sandbox.Warm, *s)
			if s.Source == "" {
				t.Errorf("the manifest's sandbox usage has no figures from the bubblewrap sandbox's cgroup: %q", s.Missing)
			}
		})
	}
}
