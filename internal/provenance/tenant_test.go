package provenance_test

import (
	"bytes"
	"errors"
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

// TestCheckRun: a manifest is the run of the job and tenant it records; one recording no
// tenant (committed before tenants) is tenant default's.
func TestCheckRun(t *testing.T) {
	const other = "20261202t101500-000000000000"
	withTenant := func(name string) provenance.Statement {
		return provenance.Statement{Predicate: provenance.Manifest{Job: provenance.Job{ID: jobID}, Tenant: provenance.Tenant{Name: name}}}
	}
	tests := []struct {
		name   string
		stmt   provenance.Statement
		tenant string
		id     string
		ok     bool
	}{
		{"its job and tenant", withTenant("team-a"), "team-a", jobID, true},
		{"another job", withTenant("team-a"), "team-a", other, false},
		{"another tenant", withTenant("team-a"), "default", jobID, false},
		{"before tenants, read as default's", withTenant(""), "default", jobID, true},
		{"before tenants, read as another's", withTenant(""), "team-a", jobID, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.stmt.CheckRun(tt.tenant, tt.id)
			if tt.ok != (err == nil) || (err != nil && !errors.Is(err, provenance.ErrInvalid)) {
				t.Errorf("CheckRun(%s, %s) = %v, want ok %v (else ErrInvalid)", tt.tenant, tt.id, err, tt.ok)
			}
		})
	}
}

// TestVerifyKeyringHoldsTheRunToTheTenant: a signed run of team-a's, read from another
// tenant's folder, fails its manifest check, however well it is signed.
func TestVerifyKeyringHoldsTheRunToTheTenant(t *testing.T) {
	r := setup(t, true)
	ring := provenance.SingleKey("worker", r.pub)
	if report, err := provenance.VerifyKeyring(t.Context(), r.store, "team-a", jobID, ring); err != nil || !report.OK() {
		t.Fatalf("verify as team-a's: %v", err)
	}
	report, err := provenance.VerifyKeyring(t.Context(), r.store, "default", jobID, ring)
	if !errors.Is(err, provenance.ErrInvalid) || report.OK() || len(report.Checks) != 1 || report.Checks[0].Name != "manifest" {
		t.Errorf("verify as default's: %v %+v; want the manifest check failed with ErrInvalid", err, report.Checks)
	}
	// A key its keyring gives to other tenants does not vouch for team-a's run.
	for _, tt := range []struct {
		tenants []string
		ok      bool
	}{{[]string{"team-a"}, true}, {[]string{"team-b", "team-a"}, true}, {[]string{"team-b"}, false}} {
		ring := provenance.Keyring{{Name: "worker", Key: r.pub, Tenants: tt.tenants}}
		report, err := provenance.VerifyKeyring(t.Context(), r.store, "team-a", jobID, ring)
		if report.OK() != tt.ok || (!tt.ok && !errors.Is(err, provenance.ErrBadSignature)) {
			t.Errorf("verify with a key for %v: %v; want ok %v", tt.tenants, err, tt.ok)
		}
	}
}
