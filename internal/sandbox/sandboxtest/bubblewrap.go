package sandboxtest

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/boxcar-run/boxcar/internal/sandbox"
)

// Bubblewrap is a real bubblewrap provider over a fresh root of the test's, with edit applied
// to its config. A host without bubblewrap fails the test with the provider's advice
// (`apt-get install -y bubblewrap`): containment must not go untested quietly.
func Bubblewrap(t testing.TB, edit ...func(*sandbox.BubblewrapConfig)) *sandbox.BubblewrapProvider {
	t.Helper()
	cfg := sandbox.BubblewrapConfig{Root: SearchableTempDir(t)}
	for _, e := range edit {
		e(&cfg)
	}
	p, err := sandbox.NewBubblewrap(cfg)
	if err != nil {
		t.Fatalf("NewBubblewrap: %v", err)
	}
	return p
}

// SearchableTempDir is a temporary folder that other users may pass through (not list):
// sandboxes run as host uids of their own, and bwrap, running as them, resolves paths below it.
func SearchableTempDir(t testing.TB) string {
	t.Helper()
	dir := t.TempDir()
	for _, d := range []string{filepath.Dir(dir), dir} {
		if err := os.Chmod(d, 0o711); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}
