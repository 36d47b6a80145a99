//go:build integration

package sandbox_test

import (
	"context"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/boxcar-run/boxcar/internal/config"
	"github.com/boxcar-run/boxcar/internal/sandbox"
	"github.com/boxcar-run/boxcar/internal/sandbox/sandboxtest"
)

// workerBinary is a copy of the test binary with version appended: another build of the worker,
// as each upgrade brings. (An ELF runs the same with bytes after its end.)
func workerBinary(t *testing.T, dir, version string) string {
	t.Helper()
	src, err := os.Open(os.Args[0])
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	path := filepath.Join(dir, "boxcar-"+version)
	dst, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_EXCL, 0o755)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.Copy(dst, src); err != nil {
		t.Fatal(err)
	}
	if _, err := dst.WriteString("\nversion " + version + "\n"); err != nil {
		t.Fatal(err)
	}
	if err := dst.Close(); err != nil {
		t.Fatal(err)
	}
	return path
}

// TestBridgeCopiesOfOldVersionsAreRemoved: a worker on a Root restarted after each of three
// upgrades, each run using egress once. Each version copies its binary (the egress bridge) into
// Root as egress-bridge-<digest>; a worker that starts removes the copies no sandbox holds, so
// Root (by default under $TMPDIR, often a tmpfs) does not keep one whole worker binary per
// version ever run. A copy a live sandbox binds stays: that of a worker of an older version
// still running its jobs.
func TestBridgeCopiesOfOldVersionsAreRemoved(t *testing.T) {
	root := sandboxtest.SearchableTempDir(t)
	bins := t.TempDir()
	const ca = "-----BEGIN CERTIFICATE-----\ntest\n-----END CERTIFICATE-----\n"
	for _, version := range []string{"1.0", "1.1", "1.2"} {
		bin := workerBinary(t, bins, version)
		p := sandboxtest.Bubblewrap(t, func(c *sandbox.BubblewrapConfig) { c.Root, c.BridgePath = root, bin })
		sb, err := p.Start(context.Background(), sandboxtest.Spec("egress-job", config.SandboxSpec{}))
		if err != nil {
			t.Fatal(err)
		}
		ln, err := sb.(sandbox.Egress).AttachEgress(t.Context(), []byte(ca))
		if err != nil {
			t.Fatalf("AttachEgress: %v", err)
		}
		ln.Close()
		if err := sb.Close(context.Background()); err != nil {
			t.Fatal(err)
		}
		// The worker of this version stops; the next version starts on the same Root.
	}
	// A worker of an older version runs a sandbox with egress on the same Root meanwhile.
	old := sandboxtest.Bubblewrap(t, func(c *sandbox.BubblewrapConfig) { c.Root, c.BridgePath = root, workerBinary(t, bins, "0.9") })
	sb, err := old.Start(context.Background(), sandboxtest.Spec("old-job", config.SandboxSpec{}))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sb.Close(context.Background()) })
	ln, err := sb.(sandbox.Egress).AttachEgress(t.Context(), []byte(ca))
	if err != nil {
		t.Fatalf("AttachEgress: %v", err)
	}
	defer ln.Close()

	sandboxtest.Bubblewrap(t, func(c *sandbox.BubblewrapConfig) { c.Root = root })
	if res, err := sb.Exec(context.Background(), sandbox.ExecRequest{Argv: []string{"true"}}); err != nil || res.ExitCode != 0 {
		t.Errorf("the older worker's sandbox could not run a command behind its bridge after the sweep: %+v, %v", res, err)
	}

	entries, err := os.ReadDir(root)
	if err != nil {
		t.Fatal(err)
	}
	var copies []string
	var size int64
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), "egress-bridge-") {
			fi, _ := e.Info()
			copies = append(copies, e.Name())
			size += fi.Size()
		}
	}
	if len(copies) != 1 {
		t.Errorf("Root holds %d copies of worker binaries (%d MiB) after three upgrades: %v; want the one a live sandbox binds",
			len(copies), size>>20, copies)
	}
}
