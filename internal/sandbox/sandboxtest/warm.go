package sandboxtest

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/boxcar-run/boxcar/internal/config"
	"github.com/boxcar-run/boxcar/internal/pool"
	"github.com/boxcar-run/boxcar/internal/sandbox"
	"github.com/boxcar-run/boxcar/test/harness"
)

// Warm is p with every sandbox taken from a warm pool (internal/pool): each Start fills a pool
// of the spec's profile, and while its sandbox starts another job runs beside it in a sandbox
// of its own (a file in its workdir, /tmp and /dev/shm, a process left running with a marker in its
// environment), kept running until the test ends. The Start fails unless the pool's sandbox
// was warm. The suites run on it show that a warm sandbox behaves as a cold one.
func Warm(t testing.TB, p sandbox.Provider) sandbox.Provider {
	return &warmProvider{t: t, p: p}
}

type warmProvider struct {
	t testing.TB
	p sandbox.Provider
}

type noLag struct{}

func (noLag) Lags(context.Context) ([]pool.Lag, error) { return nil, nil }

func (w *warmProvider) Backend() string { return w.p.Backend() }

func (w *warmProvider) Start(ctx context.Context, spec sandbox.Spec) (sandbox.Sandbox, error) {
	prof := config.Profile{Sandbox: spec.SandboxSpec, Warm: &config.Warm{Min: 1, Max: 1, Idle: config.Duration(time.Hour), MaxAge: config.Duration(time.Hour)}}
	m := pool.NewMetrics(nil)
	pl, err := pool.New(pool.Config{Provider: w.p, Profiles: map[string]config.Profile{"warm": prof}, Slots: 2, Lag: noLag{},
		Metrics: m, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		return nil, err
	}
	defer pl.Close()
	pl.Reconcile(ctx) // the warm sandbox starts now, in the background
	if err := w.neighbour(ctx, spec); err != nil {
		return nil, err
	}
	// Taken once ready, warm-up included (bubblewrap: its first command's spare), so that the
	// suites run on the sandbox a waiting job gets.
	if err := harness.Poll(ctx, time.Minute, "sandboxtest: the pool's sandbox ready", func(context.Context) (bool, error) {
		return testutil.ToFloat64(m.Size.WithLabelValues("warm")) >= 1, nil
	}); err != nil {
		return nil, err
	}
	sb, warm, err := pl.Take(ctx, "sandboxtest", "warm", spec.JobID, spec)
	if err != nil {
		return nil, err
	}
	if !warm {
		_ = sb.Close(ctx)
		return nil, errors.New("sandboxtest: the pool's sandbox was not warm")
	}
	return sb, nil
}

// neighbourMark is in the environment of the neighbour's process, and its file's name.
const neighbourMark = "boxcar-warm-neighbour"

// neighbour runs another job beside the warm sandbox: a file and a process that stays.
func (w *warmProvider) neighbour(ctx context.Context, spec sandbox.Spec) error {
	nb, err := w.p.Start(ctx, Spec("neighbour-"+spec.JobID, spec.SandboxSpec))
	if err != nil {
		return fmt.Errorf("sandboxtest: start the neighbour: %w", err)
	}
	w.t.Cleanup(func() { _ = nb.Close(context.WithoutCancel(ctx)) })
	if err := nb.WriteFile(ctx, neighbourMark+".txt", []byte("the neighbour's")); err != nil {
		return err
	}
	res, err := nb.Exec(ctx, sandbox.ExecRequest{Argv: []string{"sh", "-c", "echo x > /tmp/" + neighbourMark + "; echo x > /dev/shm/" + neighbourMark + "; sleep 600 >/dev/null 2>&1 &"},
		Env: map[string]string{"MARK": neighbourMark}, Timeout: 30 * time.Second})
	if err != nil || res.ExitCode != 0 {
		return fmt.Errorf("sandboxtest: neighbour: exit %d, %v: %s", res.ExitCode, err, res.Stderr)
	}
	return nil
}

// RunWarmIsolation checks that a sandbox taken warm from a pool while another job ran beside
// it shows nothing of that job: no file in its workdir, /tmp or /dev/shm, no process and no environment
// of it, no network interface but loopback.
func RunWarmIsolation(t *testing.T, p sandbox.Provider) {
	sb := StartSpec(t, Warm(t, p), config.SandboxSpec{})
	res := Sh(t, sb, `ls -A . /tmp /dev/shm; cat /proc/[0-9]*/environ 2>/dev/null | tr '\0' '\n' | grep -c `+neighbourMark+`; `+
		`ps_count=0; for d in /proc/[0-9]*; do ps_count=$((ps_count+1)); done; echo procs=$ps_count; `+
		`tail -n +3 /proc/net/dev | cut -d: -f1 | tr -d ' '`)
	out := string(res.Stdout)
	t.Logf("warm sandbox sees:\n%s", out)
	if strings.Contains(out, neighbourMark) {
		t.Errorf("the warm sandbox sees its neighbour's files or environment:\n%s", out)
	}
	lines := strings.Fields(out)
	for _, l := range lines {
		switch {
		case l == "0", l == ".:", l == "/tmp:", l == "/dev/shm:", l == "lo":
		case strings.HasPrefix(l, "procs="):
			// sh, the loop's subshells and bwrap's init: a handful, never the neighbour's sleep.
			if n := strings.TrimPrefix(l, "procs="); len(n) > 1 {
				t.Errorf("the warm sandbox sees %s processes, more than its own", n)
			}
		default:
			t.Errorf("the warm sandbox sees %q; want an empty workdir and /tmp, no neighbour and only lo", l)
		}
	}
}
