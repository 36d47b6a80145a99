//go:build integration

package sandbox_test

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/boxcar-run/boxcar/internal/config"
	"github.com/boxcar-run/boxcar/internal/sandbox"
	"github.com/boxcar-run/boxcar/internal/sandbox/sandboxtest"
	"github.com/boxcar-run/boxcar/internal/spawn"
)

// BenchmarkBubblewrapLifecycle is row 2: a sandbox's whole life through the provider (Start,
// Exec `true`, Close) against a bare bwrap process with the same namespaces, mounts and options
// (read from a sandbox of the same provider) over a folder made and removed around it. The two
// alternate, one of each per iteration. What Boxcar adds: the lock file, the workdir's tmpfs,
// the cgroup and moving bwrap into it, the rlimits set on bwrap, the options pipe, the disk
// watch and the cleanup checks.
func BenchmarkBubblewrapLifecycle(b *testing.B) {
	p := sandboxtest.Bubblewrap(b)
	ctx := context.Background()
	spec := sandboxtest.Spec("bench", config.SandboxSpec{})
	req := sandbox.ExecRequest{Argv: []string{"true"}, Timeout: 30 * time.Second}
	template := sandboxtest.StartSpec(b, p, spec.SandboxSpec) // whose options the bare process copies
	uid := sandbox.BubblewrapHostState(template).UID
	bareRoot := sandboxtest.SearchableTempDir(b)

	boxcar := func() time.Duration {
		begin := time.Now()
		sb, err := p.Start(ctx, spec)
		if err != nil {
			b.Fatal(err)
		}
		res, err := sb.Exec(ctx, req)
		if err != nil || res.ExitCode != 0 {
			b.Fatalf("exec true: %v, exit %d, stderr %q", err, res.ExitCode, res.Stderr)
		}
		if err := sb.Close(ctx); err != nil {
			b.Fatal(err)
		}
		return time.Since(begin)
	}
	bare := func() time.Duration {
		begin := time.Now()
		dir, err := os.MkdirTemp(bareRoot, "bare-")
		if err != nil {
			b.Fatal(err)
		}
		if uid >= 0 {
			if err := os.Chown(dir, uid, uid); err != nil {
				b.Fatal(err)
			}
		}
		cmd, done, err := sandbox.BareBwrap(template, dir, req.Argv)
		if err != nil {
			b.Fatal(err)
		}
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		err = spawn.Start(cmd)
		done()
		if err == nil {
			err = cmd.Wait()
		}
		if err != nil {
			b.Fatalf("bare bwrap: %v: %s", err, stderr.Bytes())
		}
		if err := os.RemoveAll(filepath.Clean(dir)); err != nil {
			b.Fatal(err)
		}
		return time.Since(begin)
	}
	boxcar()
	bare()
	var tBoxcar, tBare []time.Duration
	b.ResetTimer()
	for range b.N {
		tBoxcar, tBare = append(tBoxcar, boxcar()), append(tBare, bare())
	}
	b.StopTimer()
	x, y := median(tBoxcar), median(tBare)
	b.ReportMetric(float64(x)/1e6, "boxcar-ms/op")
	b.ReportMetric(float64(y)/1e6, "bare-ms/op")
	b.ReportMetric(float64(x)/float64(y), "x-of-bare")
}

func median(d []time.Duration) time.Duration {
	s := append([]time.Duration(nil), d...)
	slices.Sort(s)
	return s[len(s)/2]
}

// BenchmarkBubblewrapEgressLifecycle is row 12: a sandbox's life with networking on (Start,
// AttachEgress, Exec `true` behind the egress bridge, Close) against the same with networking
// off, alternating, one of each per iteration. What egress adds: the socket and CA in the
// egress folder, two more binds and the bridge (a Go process that listens and starts the
// command) in front of every command. The proxy itself is rows 8-10.
func BenchmarkBubblewrapEgressLifecycle(b *testing.B) {
	p := sandboxtest.Bubblewrap(b)
	ctx := context.Background()
	spec := sandboxtest.Spec("bench", config.SandboxSpec{})
	req := sandbox.ExecRequest{Argv: []string{"true"}, Timeout: 30 * time.Second}
	life := func(network bool) time.Duration {
		begin := time.Now()
		sb, err := p.Start(ctx, spec)
		if err != nil {
			b.Fatal(err)
		}
		if network {
			ln, err := sb.(sandbox.Egress).AttachEgress(ctx, []byte("ca"))
			if err != nil {
				b.Fatal(err)
			}
			defer ln.Close()
		}
		res, err := sb.Exec(ctx, req)
		if err != nil || res.ExitCode != 0 {
			b.Fatalf("exec true: %v, exit %d, stderr %q", err, res.ExitCode, res.Stderr)
		}
		if err := sb.Close(ctx); err != nil {
			b.Fatal(err)
		}
		return time.Since(begin)
	}
	life(true) // places the bridge binary once
	life(false)
	var on, off []time.Duration
	b.ResetTimer()
	for range b.N {
		on, off = append(on, life(true)), append(off, life(false))
	}
	b.StopTimer()
	x, y := median(on), median(off)
	b.ReportMetric(float64(x)/1e6, "network-ms/op")
	b.ReportMetric(float64(y)/1e6, "none-ms/op")
	b.ReportMetric(float64(x)/float64(y), "x-of-none")
}
