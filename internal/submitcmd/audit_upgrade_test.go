package submitcmd

import (
	"strings"
	"testing"

	"github.com/boxcar-run/boxcar/internal/store"
)

// TestAuditUpgradeVerifyRunCommittedBeforeTenants: a run an older worker committed and signed
// before tenants sits where that worker wrote every run, runs/ID/ (and its input at
// inputs/sha256/HEX) in the store's root. docs/provenance.md says such a run "is tenant
// default's", and nothing says to move it; today's `submit verify ID` (tenant default) looks
// only under tenants/default/ and fails the honest run as it fails a tampered one (exit 8,
// "FAIL manifest.json"), with nothing that says where the run is or that it is older.
func TestAuditUpgradeVerifyRunCommittedBeforeTenants(t *testing.T) {
	te := newTestEnv(t)
	root, err := store.Open(t.Context(), "file://"+te.storeDir, store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { root.Close() })
	tenants := te.st
	te.st = root // the older worker's layout: no tenants/ folder
	id := te.commitRun(t, true)
	te.st = tenants

	stdout, _, err := te.submit(t, "verify", id)
	if exitCode(err) != 0 {
		t.Errorf("submit verify of a run signed before tenants: exit %d (%v), want 0 (the run is intact and signed by the trusted key)\n%s",
			exitCode(err), err, stdout)
	}
	if exitCode(err) == exitVerifyFailed && !strings.Contains(stdout+message(err), "before tenants") {
		t.Errorf("and the failure does not say the run is in the layout before tenants:\n%s", stdout)
	}
}
