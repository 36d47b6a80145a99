package submitcmd

import (
	"bytes"
	"testing"

	"github.com/boxcar-run/boxcar/internal/provenance"
)

// TestAuditProvVerifyRefusesARunOfAnotherTenant: the signed manifest of a run of tenant alpha,
// copied with its objects into tenant default's folder (by anyone who can write there: a
// submitter of default on a shared file store, or with default's store credentials), verifies
// as default's run. verify checks that the manifest names the job id of the folder but not
// the tenant whose folder it is in, though the manifest records and signs the tenant.
//
// Want: exit 8, the manifest records another tenant.
func TestAuditProvVerifyRefusesARunOfAnotherTenant(t *testing.T) {
	te := newTestEnv(t)
	id := te.commitRun(t, true, func(m *provenance.Manifest) {
		m.Tenant = provenance.Tenant{Name: "alpha", Profiles: []string{"csv-analyst"}}
	})
	var stdout, stderr bytes.Buffer
	err := Run(t.Context(), []string{"verify", id, "--store", "file://" + te.storeDir}, func(k string) string {
		return map[string]string{"BOXCAR_HOME": te.home, "BOXCAR_TENANT": "default"}[k]
	}, &stdout, &stderr)
	if exitCode(err) != exitVerifyFailed {
		t.Errorf("verify of tenant alpha's run in tenant default's folder: exit %d (%v), want %d\n%s", exitCode(err), err, exitVerifyFailed, stdout.String())
	}
}
