package submitcmd

import (
	"errors"
	"testing"

	"github.com/boxcar-run/boxcar/internal/job"
	"github.com/boxcar-run/boxcar/internal/store"
)

// TestRunCommittedBeforeTenants: a run an older worker committed and signed before tenants sits
// where that worker wrote every run, runs/ID/ (and its input at inputs/sha256/HEX) in the
// store's root. Until a worker of this version moves it into tenant default's folder,
// `submit verify`, get and manifest (and logs, for a job whose status is still there) say so (code run_before_tenants, exit 1: nothing
// decided) rather than fail the honest run as a tampered one (exit 8, "FAIL manifest.json");
// once moved, it verifies as any run.
func TestRunCommittedBeforeTenants(t *testing.T) {
	te := newTestEnv(t)
	root, err := store.Open(t.Context(), "file://"+te.storeDir, store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { root.Close() })
	tenant := te.st
	te.st = root // the older worker's layout: no tenants/ folder
	id := te.commitRun(t, true)
	te.st = tenant

	for _, args := range [][]string{{"verify", id}, {"get", id, "--out", t.TempDir()}, {"manifest", id}} {
		_, _, err := te.submit(t, args...)
		if code := exitCode(err); code != 1 || !errors.Is(err, errRunBeforeTenants) || ErrorCode(err) != codeRunBeforeTenants {
			t.Errorf("submit %s of a run at the store's root, not yet moved: exit %d, code %s (%v); want exit 1, code %s",
				args[0], code, ErrorCode(err), err, codeRunBeforeTenants)
		}
	}

	// A worker of this version starts.
	if _, err := store.AdoptRootLayout(t.Context(), root, store.ForTenant(root, job.DefaultTenant)); err != nil {
		t.Fatal(err)
	}
	stdout, _, err := te.submit(t, "verify", id)
	if exitCode(err) != 0 {
		t.Errorf("submit verify of the run signed before tenants, moved: exit %d (%v), want 0\n%s", exitCode(err), err, stdout)
	}
}
