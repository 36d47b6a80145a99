package provenance_test

import (
	"bytes"
	"os"
	"path/filepath"
	"reflect"
	"testing"

	"github.com/boxcar-run/boxcar/internal/provenance"
)

// TestManifestTenantAndClaim: a manifest records the tenant and its grant as the worker saw
// them, and the submitter's name only as a claim; a manifest committed before either (the
// v1-keyid fixture, signed by that version) still parses, its submitted_by read as the claim.
func TestManifestTenantAndClaim(t *testing.T) {
	old, err := os.ReadFile(filepath.Join("testdata", "v1-keyid", "manifest.json"))
	if err != nil {
		t.Fatal(err)
	}
	built, err := provenance.Build(sampleManifest(t), sampleSubjects())
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name        string
		data        []byte
		wantClaim   string
		wantTenant  provenance.Tenant
		has, hasNot string
	}{
		{name: "built now", data: built, wantClaim: "alice",
			wantTenant: provenance.Tenant{Name: "team-a", Profiles: []string{"csv-analyst"}, DailyTokens: 2_000_000, MaxConcurrent: 4},
			has:        `"submitted_by_claimed":"alice"`, hasNot: `"submitted_by":`},
		{name: "committed before tenants", data: old, wantClaim: "alice", has: `"submitted_by":"alice"`, hasNot: `"tenant"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if !bytes.Contains(tt.data, []byte(tt.has)) || bytes.Contains(tt.data, []byte(tt.hasNot)) {
				t.Fatalf("manifest: want %s and no %s:\n%s", tt.has, tt.hasNot, tt.data)
			}
			st, err := provenance.Parse(tt.data)
			if err != nil {
				t.Fatal(err)
			}
			m := st.Predicate
			if m.Job.SubmittedByClaimed != tt.wantClaim {
				t.Errorf("submitted_by_claimed = %q, want %q", m.Job.SubmittedByClaimed, tt.wantClaim)
			}
			if !reflect.DeepEqual(m.Tenant, tt.wantTenant) {
				t.Errorf("tenant = %+v, want %+v", m.Tenant, tt.wantTenant)
			}
		})
	}
}
