//go:build integration

package pool_test

import (
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"golang.org/x/sys/unix"

	"github.com/boxcar-run/boxcar/internal/backoff"
	"github.com/boxcar-run/boxcar/internal/config"
	"github.com/boxcar-run/boxcar/internal/pool"
	"github.com/boxcar-run/boxcar/internal/sandbox"
	"github.com/boxcar-run/boxcar/internal/sandbox/sandboxtest"
	"github.com/boxcar-run/boxcar/test/harness"
)

// bubblewrapPool is a pool of one warm bubblewrap sandbox (profile p) on a Root of its own,
// which it returns, filled and ready.
func bubblewrapPool(t *testing.T) (*pool.Pool, *pool.Metrics, string) {
	t.Helper()
	root := sandboxtest.SearchableTempDir(t)
	prov := sandboxtest.Bubblewrap(t, func(c *sandbox.BubblewrapConfig) { c.Root = root })
	m := pool.NewMetrics(nil)
	prof := config.Profile{Warm: &config.Warm{Min: 1, Max: 1, Idle: config.Duration(time.Hour), MaxAge: config.Duration(time.Hour)}}.WithDefaults()
	p, err := pool.New(pool.Config{Provider: prov, Profiles: map[string]config.Profile{"p": prof}, Slots: 2,
		Lag: &fakeLag{lag: map[string]pool.Lag{}}, Metrics: m, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	p.Reconcile(t.Context())
	harness.Wait(t, "the pool's sandbox ready", func() (bool, error) { return testutil.ToFloat64(m.Size.WithLabelValues("p")) == 1, nil })
	return p, m, root
}

// TestWarmSandboxLostWhileIdleReplaced: a warm bubblewrap sandbox whose workdir was removed
// from the host while it waited (an operator's cleanup of the Root) is not handed to a job,
// whose every call would fail with ErrSandboxLost and cost it a delivery: its claim fails, the
// pool removes it, and the job gets a sandbox that works.
func TestWarmSandboxLostWhileIdleReplaced(t *testing.T) {
	t.Parallel()
	p, m, root := bubblewrapPool(t)
	dirs, err := filepath.Glob(filepath.Join(root, "boxcar-pool-p-????????"))
	if err != nil || len(dirs) != 1 {
		t.Fatalf("the warm sandbox's workdir: %v, %v", dirs, err)
	}
	if err := unix.Unmount(dirs[0], unix.MNT_DETACH); err != nil && err != unix.EINVAL {
		t.Fatal(err)
	}
	if err := os.RemoveAll(dirs[0]); err != nil {
		t.Fatal(err)
	}
	sb, warm, err := p.Take(t.Context(), "t", "p", "job-1", sandboxtest.Spec("job-1", config.SandboxSpec{}))
	if err != nil {
		t.Fatal(err)
	}
	defer sb.Close(context.Background())
	if err := sb.WriteFile(t.Context(), "in.txt", []byte("hello")); err != nil {
		t.Errorf("the job's first write: %v", err)
	}
	res, err := sb.Exec(t.Context(), sandbox.ExecRequest{Argv: []string{"cat", "in.txt"}, Timeout: 30 * time.Second})
	if err != nil || string(res.Stdout) != "hello" {
		t.Errorf("the job's first command: %v, exit %d, stdout %q, stderr %q", err, res.ExitCode, res.Stdout, res.Stderr)
	}
	if warm {
		t.Error("the lost sandbox was handed to the job as warm")
	}
	if got := testutil.ToFloat64(m.Replaced.WithLabelValues("p", "claim_failed")); got != 1 {
		t.Errorf("removed{claim_failed} %v, want 1", got)
	}
}

// TestFailingStartsBackOff: a profile whose sandboxes cannot start (here its image folder is
// gone from the host; on Kubernetes an image that cannot be pulled) is tried again backing off
// (internal/backoff), not at every round: the pool looks every 500 ms and whenever a job takes
// or returns a sandbox, and started (a pod created and deleted, a warning logged) each of its
// missing sandboxes every time, for as long as the failure lasted. Once the failure ends, the
// pool fills again.
func TestFailingStartsBackOff(t *testing.T) {
	t.Parallel()
	image := sandboxtest.SearchableTempDir(t)
	prov := sandboxtest.Bubblewrap(t)
	m := pool.NewMetrics(nil)
	clk := &clock{now: time.Unix(1_000_000, 0)}
	prof := config.Profile{Sandbox: config.SandboxSpec{Image: filepath.Join(image, "gone")},
		Warm: &config.Warm{Min: 2, Idle: config.Duration(time.Hour), MaxAge: config.Duration(time.Hour)}}.WithDefaults()
	p, err := pool.New(pool.Config{Provider: prov, Profiles: map[string]config.Profile{"p": prof}, Slots: 2,
		Lag: &fakeLag{lag: map[string]pool.Lag{}}, Metrics: m, Logger: slog.New(slog.DiscardHandler), Now: clk.Now})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	failed := func() float64 { return testutil.ToFloat64(m.Replaced.WithLabelValues("p", "start_failed")) }
	for range 10 { // ten rounds within the first backoff
		p.Reconcile(t.Context())
		p.Settle()
	}
	if got := failed(); got != 2 {
		t.Errorf("ten rounds at once started %v sandboxes that failed; want the 2 missing tried once", got)
	}
	clk.advance(backoff.Max)
	p.Reconcile(t.Context())
	p.Settle()
	if got := failed(); got != 4 {
		t.Errorf("after the backoff %v failed starts in all; want the 2 tried again (4)", got)
	}
	if err := os.Mkdir(filepath.Join(image, "gone"), 0o755); err != nil { // the failure ends
		t.Fatal(err)
	}
	clk.advance(backoff.Max)
	p.Reconcile(t.Context())
	harness.Wait(t, "the pool filled once its sandboxes start", func() (bool, error) {
		return testutil.ToFloat64(m.Size.WithLabelValues("p")) == 2, nil
	})
}

// hostProcesses are the host's processes whose command line is cmdline (NUL-separated).
func hostProcesses(t *testing.T, cmdline string) []string {
	t.Helper()
	dirs, err := filepath.Glob("/proc/[0-9]*/cmdline")
	if err != nil {
		t.Fatal(err)
	}
	var pids []string
	for _, f := range dirs {
		if b, err := os.ReadFile(f); err == nil && string(b) == cmdline {
			pids = append(pids, filepath.Base(filepath.Dir(f)))
		}
	}
	return pids
}

// TestWarmSandboxNeverReused: the job after one that left a file, a process of its own session
// and its sandbox's Close behind gets another sandbox, warm, in which none of that is: the
// first one's host folder is gone before the pool's next one takes its place.
func TestWarmSandboxNeverReused(t *testing.T) {
	t.Parallel()
	p, m, root := bubblewrapPool(t)
	take := func(job string) sandbox.Sandbox {
		sb, warm, err := p.Take(t.Context(), "t", "p", job, sandboxtest.Spec(job, config.SandboxSpec{}))
		if err != nil || !warm {
			t.Fatalf("take for %s: warm %v, %v", job, warm, err)
		}
		return sb
	}
	first := take("job-1")
	sandboxtest.Sh(t, first, "echo mine > left.txt; echo mine > /tmp/left.txt; setsid sleep 6061 </dev/null >/dev/null 2>&1 &")
	firstDir := filepath.Join(root, first.Info().ID)
	if err := first.Close(t.Context()); err != nil {
		t.Fatal(err)
	}
	p.Reconcile(t.Context())
	harness.Wait(t, "the pool's next sandbox ready", func() (bool, error) { return testutil.ToFloat64(m.Size.WithLabelValues("p")) == 1, nil })
	second := take("job-2")
	defer second.Close(context.Background())
	if second.Info().ID == first.Info().ID {
		t.Fatalf("job-2 got %s, job-1's sandbox", second.Info().ID)
	}
	if _, err := os.Lstat(firstDir); !os.IsNotExist(err) {
		t.Errorf("job-1's folder %s: %v; want it gone", firstDir, err)
	}
	if pids := hostProcesses(t, "sleep\x006061\x00"); len(pids) > 0 {
		t.Errorf("job-1's process still runs on the host after its sandbox's Close: pids %v", pids)
	}
	res := sandboxtest.Sh(t, second, "ls -A . /tmp; for d in /proc/[0-9]*; do tr '\\0' ' ' < $d/cmdline; echo; done | grep -c '^sleep 6061' || true")
	if got := string(res.Stdout); got != ".:\n\n/tmp:\n0\n" {
		t.Errorf("job-2's sandbox holds:\n%s\nwant an empty workdir and /tmp, and no process of job-1's", got)
	}
}
