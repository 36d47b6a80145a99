//go:build integration

package sandbox_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/boxcar-run/boxcar/internal/sandbox"
	"github.com/boxcar-run/boxcar/internal/sandbox/sandboxtest"
)

// TestEscapeSuite runs the escape and exhaustion suite (issue 11) on bubblewrap, judged from
// the host: the filesystem under the workdir's host folder read with statfs, the host's
// process table. Each sandbox runs as a host uid of its own with RLIMIT_NPROC at its pids
// bound, so the spec's bound is the host's.
func TestEscapeSuite(t *testing.T) {
	t.Parallel()
	sandboxtest.RunEscape(t, sandboxtest.Bubblewrap(t), bubblewrapHost)
}

// bubblewrapHost judges a bubblewrap sandbox from the host: the workdir's host folder read with
// statfs, the spec's pids bound, the signals a uid may queue.
var bubblewrapHost = sandboxtest.Host{
	WorkdirUse: func(sb sandbox.Sandbox) (int64, int64, error) {
		var st unix.Statfs_t
		if err := unix.Statfs(sandbox.BubblewrapHostState(sb).Dir, &st); err != nil {
			return 0, 0, err
		}
		return int64(st.Blocks-st.Bfree) * st.Bsize, int64(st.Files - st.Ffree), nil
	},
	PIDs:          sandboxtest.EscapeSpec.PIDs,
	SignalsQueued: sandbox.SignalsQueuedBound,
}

// TestEscapeDiskBoundRefusedWithoutMechanism: where no tmpfs can be mounted and the operator
// has not accepted best effort, the provider refuses to start (every profile has a disk bound).
func TestEscapeDiskBoundRefusedWithoutMechanism(t *testing.T) {
	t.Parallel()
	_, err := sandbox.NewBubblewrap(sandbox.BubblewrapConfig{Root: sandboxtest.SearchableTempDir(t)}.WithoutDiskMountStrict())
	if !errors.Is(err, sandbox.ErrUnavailable) {
		t.Fatalf("NewBubblewrap without a disk mechanism: err = %v, want ErrUnavailable naming disk_best_effort", err)
	}
	t.Log(err)
}

// BenchmarkHardenedLifecycle is a sandbox's start, one `true` and its close as hardened for
// issue 11 (the workdir on a tmpfs of its own, the seccomp filter) against the walked workdir
// and no filter it replaces, alternating in the same run.
func BenchmarkHardenedLifecycle(b *testing.B) {
	ctx := context.Background()
	spec := sandboxtest.Spec("bench", sandboxtest.EscapeSpec)
	req := sandbox.ExecRequest{Argv: []string{"true"}, Timeout: 30 * time.Second}
	lifecycle := func(p sandbox.Provider) time.Duration {
		begin := time.Now()
		sb, err := p.Start(ctx, spec)
		if err != nil {
			b.Fatal(err)
		}
		if res, err := sb.Exec(ctx, req); err != nil || res.ExitCode != 0 {
			b.Fatalf("exec true: %v, exit %d, stderr %q", err, res.ExitCode, res.Stderr)
		}
		if err := sb.Close(ctx); err != nil {
			b.Fatal(err)
		}
		return time.Since(begin)
	}
	mounted, walked := sandboxtest.Bubblewrap(b), sandboxtest.Bubblewrap(b, sandbox.WithoutDiskMount, sandbox.WithoutSeccomp)
	lifecycle(mounted)
	lifecycle(walked)
	var tMounted, tWalked []time.Duration
	b.ResetTimer()
	for range b.N {
		tMounted, tWalked = append(tMounted, lifecycle(mounted)), append(tWalked, lifecycle(walked))
	}
	b.StopTimer()
	x, y := median(tMounted), median(tWalked)
	b.ReportMetric(float64(x)/1e6, "hardened-ms/op")
	b.ReportMetric(float64(y)/1e6, "before-ms/op")
	b.ReportMetric(float64(x)/float64(y), "x-of-before")
}
