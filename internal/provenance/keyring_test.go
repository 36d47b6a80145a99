package provenance_test

import (
	"crypto/ed25519"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/boxcar-run/boxcar/internal/provenance"
)

// The sample run finished at 2026-12-02T10:16:30Z.
func TestVerifyKeyringRotation(t *testing.T) {
	r := setup(t, true)
	_, other := keys(t)
	dir := t.TempDir()
	writePub(t, filepath.Join(dir, "old.pub"), r.pub)
	writePub(t, filepath.Join(dir, "new.pub"), other)
	tests := []struct {
		name     string
		keyring  string
		signed   bool
		wantName string
		wantErr  error
	}{
		{name: "signed before the rotation", signed: true, wantName: "old", keyring: `
keys:
  - {name: old, public_key_file: old.pub, not_before: "2026-01-01T00:00:00Z", not_after: "2026-12-02T12:00:00Z"}
  - {name: new, public_key_file: new.pub, not_before: "2026-12-02T12:00:00Z"}`},
		{name: "signed after the key was retired", signed: true, wantErr: provenance.ErrKeyNotValid, keyring: `
keys:
  - {name: old, public_key_file: old.pub, not_after: "2026-12-02T10:00:00Z"}
  - {name: new, public_key_file: new.pub, not_before: "2026-12-02T10:00:00Z"}`},
		// The signer's clock may be job.ClockSkew off the true time a keyring's dates mean.
		{name: "signed by a clock ahead just before the rotation", signed: true, wantName: "old", keyring: `
keys:
  - {name: old, public_key_file: old.pub, not_after: "2026-12-02T10:10:00Z"}
  - {name: new, public_key_file: new.pub, not_before: "2026-12-02T10:10:00Z"}`},
		{name: "signed by a clock behind just after the key's start", signed: true, wantName: "old", keyring: `
keys:
  - {name: old, public_key_file: old.pub, not_before: "2026-12-02T10:25:00Z"}`},
		{name: "signed before the key was in use", signed: true, wantErr: provenance.ErrKeyNotValid, keyring: `
keys:
  - {name: old, public_key_file: old.pub, not_before: "2026-12-03T00:00:00Z"}`},
		{name: "signer not in the keyring", signed: true, wantErr: provenance.ErrBadSignature, keyring: `
keys:
  - {name: new, public_key_file: new.pub}`},
		{name: "unsigned run", wantErr: provenance.ErrUnsigned, keyring: `
keys:
  - {name: old, public_key_file: old.pub}`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			path := filepath.Join(dir, strings.ReplaceAll(tt.name, " ", "-")+".yaml")
			if err := os.WriteFile(path, []byte(tt.keyring), 0o600); err != nil {
				t.Fatal(err)
			}
			ring, err := provenance.LoadKeyring(path)
			if err != nil {
				t.Fatal(err)
			}
			run := r
			if !tt.signed {
				run = setup(t, false)
				writePub(t, filepath.Join(dir, "old.pub"), run.pub)
				if ring, err = provenance.LoadKeyring(path); err != nil {
					t.Fatal(err)
				}
			}
			report, err := provenance.VerifyKeyring(t.Context(), run.store, "team-a", jobID, ring)
			switch {
			case tt.wantErr == nil && err != nil:
				t.Fatalf("verify: %v", err)
			case tt.wantErr != nil && !errors.Is(err, tt.wantErr):
				t.Fatalf("verify: %v; want %v", err, tt.wantErr)
			case report.KeyName != tt.wantName:
				t.Errorf("signed by %q, want %q", report.KeyName, tt.wantName)
			}
		})
	}
}

func TestLoadKeyringRefuses(t *testing.T) {
	_, pub := keys(t)
	dir := t.TempDir()
	writePub(t, filepath.Join(dir, "k.pub"), pub)
	for name, text := range map[string]string{
		"no keys":         "keys: []",
		"no name":         "keys: [{public_key_file: k.pub}]",
		"twice the name":  "keys: [{name: a, public_key_file: k.pub}, {name: a, public_key_file: k.pub}]",
		"no key":          "keys: [{name: a}]",
		"both keys":       "keys: [{name: a, public_key_file: k.pub, public_key: x}]",
		"dates backwards": `keys: [{name: a, public_key_file: k.pub, not_before: "2026-02-01T00:00:00Z", not_after: "2026-01-01T00:00:00Z"}]`,
		"unknown field":   "keys: [{name: a, public_key_file: k.pub, expires: soon}]",
		"missing file":    "keys: [{name: a, public_key_file: none.pub}]",
		"bad tenant":      "keys: [{name: a, public_key_file: k.pub, tenants: [Team_A]}]",
		"no tenant":       "keys: [{name: a, public_key_file: k.pub, tenants: []}]",
	} {
		t.Run(name, func(t *testing.T) {
			path := filepath.Join(dir, "ring.yaml")
			if err := os.WriteFile(path, []byte(text), 0o600); err != nil {
				t.Fatal(err)
			}
			if _, err := provenance.LoadKeyring(path); err == nil {
				t.Fatal("loaded; want an error")
			}
		})
	}
}

func writePub(t *testing.T, path string, pub ed25519.PublicKey) {
	t.Helper()
	der, err := x509.MarshalPKIXPublicKey(pub)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
}

// TestLoadKeyringRefusesAKeyTwice: a key listed twice, under two names or once as a file and
// once as PEM, is refused at load: a verified approval records the name of the first entry
// whose key and dates match, so one key under two names makes who decided depend on the
// order of the file, and its second dates are silently another window for the same key. The
// error names both entries and says what to do.
func TestLoadKeyringRefusesAKeyTwice(t *testing.T) {
	t.Parallel()
	_, pub := keys(t)
	dir := t.TempDir()
	writePub(t, filepath.Join(dir, "k.pub"), pub)
	writePub(t, filepath.Join(dir, "copy.pub"), pub)
	der, err := x509.MarshalPKIXPublicKey(pub)
	if err != nil {
		t.Fatal(err)
	}
	inline := strings.ReplaceAll(string(pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: der})), "\n", "\n      ")
	for name, text := range map[string]string{
		"one file, two names":  "keys: [{name: alice, public_key_file: k.pub}, {name: bob, public_key_file: k.pub}]",
		"two files of one key": "keys: [{name: alice, public_key_file: k.pub}, {name: bob, public_key_file: copy.pub}]",
		"a file and its PEM":   "keys:\n  - {name: alice, public_key_file: k.pub}\n  - name: bob\n    public_key: |\n      " + inline + "\n",
		"two windows": `keys: [{name: alice, public_key_file: k.pub, not_after: "2026-06-01T00:00:00Z"},
  {name: bob, public_key_file: k.pub, not_before: "2026-07-01T00:00:00Z"}]`,
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			path := filepath.Join(dir, strings.ReplaceAll(name, " ", "-")+".yaml")
			if err := os.WriteFile(path, []byte(text), 0o600); err != nil {
				t.Fatal(err)
			}
			_, err := provenance.LoadKeyring(path)
			if !errors.Is(err, provenance.ErrInvalid) {
				t.Fatalf("LoadKeyring: %v; want ErrInvalid", err)
			}
			for _, want := range []string{"keys[1] (bob)", "keys[0] (alice)", "one entry"} {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("error %q does not say %q", err, want)
				}
			}
		})
	}
}

// TestLoadKeyringTenants: an entry's tenants are the only tenants the key speaks for; an entry
// without them speaks for every tenant, as before tenants could be named.
func TestLoadKeyringTenants(t *testing.T) {
	_, pub := keys(t)
	_, pub2 := keys(t)
	dir := t.TempDir()
	writePub(t, filepath.Join(dir, "a.pub"), pub)
	writePub(t, filepath.Join(dir, "any.pub"), pub2)
	path := filepath.Join(dir, "ring.yaml")
	ring := "keys:\n  - {name: a, public_key_file: a.pub, tenants: [team-a, team-c]}\n  - {name: any, public_key_file: any.pub}\n"
	if err := os.WriteFile(path, []byte(ring), 0o600); err != nil {
		t.Fatal(err)
	}
	got, err := provenance.LoadKeyring(path)
	if err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		key    int
		tenant string
		want   bool
	}{{0, "team-a", true}, {0, "team-c", true}, {0, "team-b", false}, {0, "default", false}, {1, "team-b", true}, {1, "default", true}} {
		if got[tt.key].ForTenant(tt.tenant) != tt.want {
			t.Errorf("%s.ForTenant(%s) = %v, want %v", got[tt.key].Name, tt.tenant, !tt.want, tt.want)
		}
	}
}
