package provenance

import (
	"crypto/ed25519"
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"sigs.k8s.io/yaml"

	"github.com/boxcar-run/boxcar/internal/job"
)

// TrustedKey is one public key a verifier trusts, for the time it was in use. A signature made
// outside [NotBefore, NotAfter) does not count: a key retired by a rotation still verifies what
// it signed before, and nothing an honest signer signs with it after. The time is the one the
// signed document records (a run's finished_at), which the signer writes: whoever holds a
// retired key can backdate, so a leaked key is removed, not retired (docs/security.md).
type TrustedKey struct {
	// Name says whose key it is ("ci-2026", "alice"); a verified approval records it as
	// decided_by.
	Name string
	Key  ed25519.PublicKey
	// NotBefore and NotAfter bound when the key signed; zero means unbounded.
	NotBefore, NotAfter time.Time
	// Tenants are the tenants whose jobs the key speaks for (an approver's answers, a worker's
	// runs); none means every tenant's. An approver's NATS login lets it write its own
	// tenant's approvals only, but whoever may write another tenant's (that tenant's
	// approver login, which is not trusted to approve by itself) could put there an answer
	// signed by any key of the ring.
	Tenants []string
}

// ForTenant reports whether the key speaks for tenant's jobs.
func (k TrustedKey) ForTenant(tenant string) bool {
	return len(k.Tenants) == 0 || slices.Contains(k.Tenants, tenant)
}

// ValidAt reports whether the key was in use at t, a time the signer's clock wrote. The dates
// mean true time and the signer's clock may be job.ClockSkew off it, so each end is
// job.ClockSkew wider: a rotation's new key counts from that much before its not_before and the
// old one to that much after its not_after, as the other checks of a time another machine
// wrote do (docs/operations.md#clocks). The dates bound an honest signer's mistakes, not a
// leaked key, which can backdate at will: the allowance gives away nothing they guard.
func (k TrustedKey) ValidAt(t time.Time) bool {
	return (k.NotBefore.IsZero() || !t.Before(k.NotBefore.Add(-job.ClockSkew))) &&
		(k.NotAfter.IsZero() || t.Before(k.NotAfter.Add(job.ClockSkew)))
}

// Keyring is a set of trusted keys, by name.
type Keyring []TrustedKey

// SingleKey is a keyring of one key with no validity bounds: what --public-key gives.
func SingleKey(name string, pub ed25519.PublicKey) Keyring {
	if pub == nil {
		return nil
	}
	return Keyring{{Name: name, Key: pub}}
}

// keyringFile is a keyring file as written: YAML or JSON.
//
//	keys:
//	  - name: signer-2026
//	    public_key_file: signer-2026.pub   # relative to the keyring file, or
//	    public_key: |                      # the PEM itself
//	      -----BEGIN PUBLIC KEY-----
//	      ...
//	    not_before: 2026-01-01T00:00:00Z
//	    not_after: 2027-01-01T00:00:00Z
//	    tenants: [team-a]                  # optional: the tenants it speaks for
type keyringFile struct {
	Keys []keyringEntry `json:"keys"`
}

// keyringEntry is one key of a keyring file.
type keyringEntry struct {
	Name          string    `json:"name"`
	PublicKey     string    `json:"public_key,omitempty"`
	PublicKeyFile string    `json:"public_key_file,omitempty"`
	NotBefore     time.Time `json:"not_before,omitzero"`
	NotAfter      time.Time `json:"not_after,omitzero"`
	Tenants       []string  `json:"tenants,omitempty"`
}

// check says what is wrong with an entry of its own, seen holding the names of the entries
// before it; where names it in the error.
func (e keyringEntry) check(where string, seen map[string]bool) error {
	switch {
	case e.Name == "" || strings.ContainsAny(e.Name, " \t\n"):
		return fmt.Errorf("%s: %w: give each key a name without spaces", where, ErrInvalid)
	case seen[e.Name]:
		return fmt.Errorf("%s: %w: name %q is used twice", where, ErrInvalid, e.Name)
	case (e.PublicKey == "") == (e.PublicKeyFile == ""):
		return fmt.Errorf("%s (%s): %w: give exactly one of public_key and public_key_file", where, e.Name, ErrInvalid)
	case !e.NotAfter.IsZero() && !e.NotAfter.After(e.NotBefore):
		return fmt.Errorf("%s (%s): %w: not_after must come after not_before", where, e.Name, ErrInvalid)
	case e.Tenants != nil && len(e.Tenants) == 0:
		return fmt.Errorf("%s (%s): %w: tenants is empty, so the key would speak for nobody; list its tenants, or leave tenants out for every tenant", where, e.Name, ErrInvalid)
	case slices.ContainsFunc(e.Tenants, func(t string) bool { return !job.ValidTenant(t) }):
		return fmt.Errorf("%s (%s): %w: tenants %q: a tenant name is lowercase letters, digits and '-'", where, e.Name, ErrInvalid, e.Tenants)
	}
	return nil
}

// LoadKeyring reads a keyring file. Every key needs a unique name and exactly one of
// public_key and public_key_file; errors name the entry and the fix. A key is listed once:
// Match takes the first entry whose key and dates fit, so one key under two names would make
// the name an approval records (decided_by) depend on the order of the file.
func LoadKeyring(path string) (Keyring, error) {
	data, err := readKeyFile(path)
	if err != nil {
		return nil, err
	}
	var f keyringFile
	if err := yaml.UnmarshalStrict(data, &f); err != nil {
		return nil, fmt.Errorf("provenance: keyring %s: %w", path, err)
	}
	if len(f.Keys) == 0 {
		return nil, fmt.Errorf("provenance: keyring %s: %w: no keys", path, ErrInvalid)
	}
	var ring Keyring
	seen := map[string]bool{}
	for i, e := range f.Keys {
		where := fmt.Sprintf("provenance: keyring %s: keys[%d]", path, i)
		if err := e.check(where, seen); err != nil {
			return nil, err
		}
		seen[e.Name] = true
		pub, err := entryKey(path, e.PublicKey, e.PublicKeyFile)
		if err != nil {
			return nil, fmt.Errorf("%s (%s): %w", where, e.Name, err)
		}
		if j := slices.IndexFunc(ring, func(k TrustedKey) bool { return k.Key.Equal(pub) }); j >= 0 {
			return nil, fmt.Errorf("%s (%s): %w: the same public key as keys[%d] (%s); give each key one entry, with one name and the dates it was in use", where, e.Name, ErrInvalid, j, ring[j].Name)
		}
		ring = append(ring, TrustedKey{Name: e.Name, Key: pub, NotBefore: e.NotBefore.UTC(), NotAfter: e.NotAfter.UTC(), Tenants: e.Tenants})
	}
	return ring, nil
}

// entryKey is the public key of a keyring entry: its PEM, or the file it names, relative to
// the keyring file's folder.
func entryKey(path, pem, file string) (ed25519.PublicKey, error) {
	if file == "" {
		return LoadPublicKey([]byte(pem))
	}
	if !filepath.IsAbs(file) {
		file = filepath.Join(filepath.Dir(path), file)
	}
	data, err := readKeyFile(file)
	if err != nil {
		return nil, err
	}
	return LoadPublicKey(data)
}

// ErrKeyNotValid marks a signature by a trusted key made outside the key's validity dates.
var ErrKeyNotValid = errors.New("signed outside the key's validity dates")

// Match returns the key of the ring that verify accepts and that was valid at signedAt. A
// signature by a key of the ring made outside its dates wraps ErrKeyNotValid; one by no key
// of the ring wraps ErrBadSignature.
func (r Keyring) Match(signedAt time.Time, verify func(ed25519.PublicKey) bool) (TrustedKey, error) {
	var outside []string
	for _, k := range r {
		if !verify(k.Key) {
			continue
		}
		if k.ValidAt(signedAt) {
			return k, nil
		}
		outside = append(outside, fmt.Sprintf("%s (valid %s to %s)", k.Name, dateOr(k.NotBefore, "any time"), dateOr(k.NotAfter, "any time")))
	}
	if len(outside) > 0 {
		return TrustedKey{}, fmt.Errorf("%w: signed at %s by %s", ErrKeyNotValid, signedAt.UTC().Format(time.RFC3339), strings.Join(outside, ", "))
	}
	return TrustedKey{}, fmt.Errorf("%w: by none of the %d trusted keys", ErrBadSignature, len(r))
}

func dateOr(t time.Time, zero string) string {
	if t.IsZero() {
		return zero
	}
	return t.UTC().Format(time.RFC3339)
}
