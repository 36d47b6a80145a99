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

// TestAuditFleetBridgeCopiesOfOldVersionsStayInRoot: a worker on a Root restarted after each of
// three upgrades, each run using egress once. Each version copies its binary (the egress
// bridge) into Root as egress-bridge-<digest>, and nothing ever removes a copy: not the
// sandbox's Close, not the next start's leftover sweep, which handles lock files only. Root
// (by default under $TMPDIR, often a tmpfs) keeps one whole worker binary per version ever run,
// though no sandbox of any live worker uses the old ones.
func TestAuditFleetBridgeCopiesOfOldVersionsStayInRoot(t *testing.T) {
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
	sandboxtest.Bubblewrap(t, func(c *sandbox.BubblewrapConfig) { c.Root = root })

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
	if len(copies) > 1 {
		t.Errorf("Root holds %d copies of worker binaries (%d MiB) after three upgrades, with no sandbox left: %v; want at most the running version's",
			len(copies), size>>20, copies)
	}
}
