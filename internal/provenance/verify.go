package provenance

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"strings"

	"github.com/boxcar-run/boxcar/internal/job"
)

// Getter is the one store method Verify needs. Any store.Store satisfies it.
type Getter interface {
	Get(ctx context.Context, key string) (io.ReadCloser, error)
}

// The run layout, as internal/store defines it (a test keeps the two in step).
func runKey(jobID, name string) string { return "runs/" + jobID + "/" + name }
func inputKey(sha256Hex string) string { return "inputs/sha256/" + sha256Hex }

const (
	manifestName  = "manifest.json"
	signatureName = "manifest.dsse.json"
)

// maxManifestBytes bounds what Verify reads of a manifest or envelope.
const maxManifestBytes = 16 << 20

// Check is one thing Verify looked at.
type Check struct {
	// Name says what was checked: "manifest", "signature", "subject report.md",
	// "input data.csv".
	Name string
	// OK is true when the check passed. A skipped check is neither passed nor failed.
	OK      bool
	Skipped bool
	// Reason explains the result in a sentence.
	Reason string
	// Err is the failure, wrapping one of the package's sentinels; nil when OK or Skipped.
	Err error
}

// Report is the result of Verify: every check, in the order made.
type Report struct {
	JobID string
	// Statement is the parsed manifest; zero when it could not be read.
	Statement Statement
	// KeyID is the id of the key whose signature verified, KeyName its name in the keyring;
	// empty otherwise.
	KeyID   string
	KeyName string
	Checks  []Check
}

// OK reports whether the report has checks and none of them failed.
func (r Report) OK() bool {
	if len(r.Checks) == 0 {
		return false
	}
	for _, c := range r.Checks {
		if !c.OK && !c.Skipped {
			return false
		}
	}
	return true
}

// Verify checks a stored run against its manifest: the manifest parses and names this job;
// the envelope's signature verifies with pub and signs exactly the stored manifest (when pub
// is nil an envelope is not required and not checked); every subject under runs/<jobID>/ and
// every input under inputs/sha256/ has the recorded SHA-256 and size. It runs every check it
// can and returns the report with an error joining the failures (ErrMissing, ErrInvalid,
// ErrUnsigned, ErrBadSignature, ErrDigestMismatch); the error is nil exactly when report.OK().
// It does not hold the run to a tenant: a reader of a tenant's folder uses VerifyKeyring,
// which does.
func Verify(ctx context.Context, st Getter, jobID string, pub ed25519.PublicKey) (Report, error) {
	return verify(ctx, st, "", jobID, SingleKey("public-key", pub))
}

// VerifyKeyring is Verify of a run of tenant's, st being the tenant's folder, with a set of
// trusted keys: the manifest must be the run of that job of that tenant (Statement.CheckRun),
// and the signature by one of the keys, made while that key was valid. The time of signing is
// the run's finished_at, which the signature covers; a run signed before a rotation verifies
// with the retired key's entry. An empty ring checks no signature, as Verify with a nil key.
func VerifyKeyring(ctx context.Context, st Getter, tenant, jobID string, ring Keyring) (Report, error) {
	if !job.ValidTenant(tenant) {
		return Report{JobID: jobID}, fmt.Errorf("provenance: verify: %w: %q is not a tenant", ErrInvalid, tenant)
	}
	return verify(ctx, st, tenant, jobID, ring)
}

// verify is Verify and VerifyKeyring; tenant "" holds the run to its job id alone.
func verify(ctx context.Context, st Getter, tenant, jobID string, ring Keyring) (Report, error) {
	r := Report{JobID: jobID}
	if !job.ValidID(jobID) {
		return r, fmt.Errorf("provenance: verify: %w: %q is not a job id", ErrInvalid, jobID)
	}
	var errs []error
	record := func(c Check) {
		r.Checks = append(r.Checks, c)
		if c.Err != nil {
			errs = append(errs, c.Err)
		}
	}
	fail := func(name string, err error) {
		record(Check{Name: name, Reason: err.Error(), Err: err})
	}
	result := func() (Report, error) {
		if err := errors.Join(errs...); err != nil {
			return r, fmt.Errorf("provenance: verify %s: %w", jobID, err)
		}
		return r, nil
	}

	manifestKey := runKey(jobID, manifestName)
	manifest, err := fetch(ctx, st, manifestKey)
	if err != nil {
		fail("manifest", err)
		return result()
	}
	stmt, err := Parse(manifest)
	if err == nil {
		err = checkRun(stmt, tenant, jobID)
	}
	if err != nil {
		fail("manifest", fmt.Errorf("%s: %w", manifestKey, err))
		return result()
	}
	r.Statement = stmt
	record(Check{Name: "manifest", OK: true, Reason: fmt.Sprintf("%s is a Boxcar provenance statement for %s", manifestKey, runOf(tenant, jobID))})

	r.KeyID, r.KeyName = verifySignature(ctx, st, jobID, manifest, stmt, ring, record, fail)

	for _, s := range stmt.Subjects {
		name := "subject " + s.Name
		if err := checkObject(ctx, st, SubjectKey(jobID, s), s.SHA256, s.Size); err != nil {
			fail(name, err)
			continue
		}
		record(Check{Name: name, OK: true, Reason: fmt.Sprintf("sha256 %s, %d bytes", s.SHA256, s.Size)})
	}
	for _, in := range stmt.Predicate.Inputs {
		name := "input " + in.Name
		if err := checkObject(ctx, st, inputKey(in.SHA256), in.SHA256, in.Size); err != nil {
			fail(name, err)
			continue
		}
		record(Check{Name: name, OK: true, Reason: fmt.Sprintf("sha256 %s, %d bytes", in.SHA256, in.Size)})
	}
	return result()
}

// runOf names the run verify holds a manifest to.
func runOf(tenant, jobID string) string {
	if tenant == "" {
		return "job " + jobID
	}
	return "job " + jobID + " of tenant " + tenant
}

// checkRun is stmt.CheckRun, holding the run to its job alone for tenant "" (Verify).
func checkRun(stmt Statement, tenant, jobID string) error {
	if tenant == "" {
		tenant = stmt.Tenant()
	}
	return stmt.CheckRun(tenant, jobID)
}

// verifySignature records the signature check and returns the id and name of the key that
// verified, if any.
func verifySignature(ctx context.Context, st Getter, jobID string, manifest []byte, stmt Statement, ring Keyring, record func(Check), fail func(string, error)) (keyID, name string) {
	const check = "signature"
	if len(ring) == 0 {
		sigKey := runKey(jobID, signatureName)
		reason := fmt.Sprintf("%s is present but no public key was given to check it", sigKey)
		if _, err := fetch(ctx, st, sigKey); err != nil {
			reason = fmt.Sprintf("no public key given; %s could not be read either: %v", sigKey, err)
		}
		record(Check{Name: check, Skipped: true, Reason: reason})
		return "", ""
	}
	key, _, err := CheckSignature(ctx, st, jobID, manifest, stmt, ring)
	if err != nil {
		fail(check, err)
		return "", ""
	}
	keyID = KeyID(key.Key)
	record(Check{Name: check, OK: true, Reason: fmt.Sprintf("signed by key %s (%s)", key.Name, keyID)})
	return keyID, key.Name
}

// CheckSignature checks the envelope stored beside a run's manifest, stmt being the manifest
// parsed: it must be signed by a key of ring (not empty) that was valid at the run's
// finished_at and speaks for the run's tenant, and sign exactly manifest, the stored bytes. It
// returns that key and the envelope as it read and checked it: a reader that keeps the
// envelope (get) writes those bytes, never a second read, which a writer of the store could
// answer with another. An envelope that cannot be read wraps ErrUnsigned and ErrMissing (and
// store.ErrNotFound when there is none); one by no key of the ring, by a key of other tenants,
// or over another statement, ErrBadSignature; one by a key outside its dates, ErrKeyNotValid.
func CheckSignature(ctx context.Context, st Getter, jobID string, manifest []byte, stmt Statement, ring Keyring) (TrustedKey, []byte, error) {
	sigKey := runKey(jobID, signatureName)
	envelope, err := fetch(ctx, st, sigKey)
	if err != nil {
		return TrustedKey{}, nil, fmt.Errorf("%w: a public key was given but %s could not be read: %w", ErrUnsigned, sigKey, err)
	}
	var signed []byte
	key, err := ring.Match(stmt.Predicate.Timings.FinishedAt, func(pub ed25519.PublicKey) bool {
		s, verr := VerifyEnvelope(ctx, envelope, pub)
		if verr == nil {
			signed = s
		}
		return verr == nil
	})
	if err != nil {
		return TrustedKey{}, nil, fmt.Errorf("%s: %w", sigKey, err)
	}
	if !bytes.Equal(signed, manifest) {
		return TrustedKey{}, nil, fmt.Errorf("%s: %w: it signs a statement other than the stored manifest", sigKey, ErrBadSignature)
	}
	if !key.ForTenant(stmt.Tenant()) {
		return TrustedKey{}, nil, fmt.Errorf("%s: %w: signed by key %s, which signs for %s, not for tenant %s", sigKey, ErrBadSignature, key.Name, strings.Join(key.Tenants, ", "), stmt.Tenant())
	}
	return key, envelope, nil
}

// fetch reads a small object whole.
func fetch(ctx context.Context, st Getter, key string) ([]byte, error) {
	rc, err := st.Get(ctx, key)
	if err != nil {
		return nil, fmt.Errorf("%w: %s: %w", ErrMissing, key, err)
	}
	defer rc.Close()
	data, err := io.ReadAll(io.LimitReader(rc, maxManifestBytes+1))
	if err != nil {
		return nil, fmt.Errorf("%w: %s: read: %w", ErrMissing, key, err)
	}
	if len(data) > maxManifestBytes {
		return nil, fmt.Errorf("%w: %s is larger than %d bytes", ErrInvalid, key, maxManifestBytes)
	}
	return data, nil
}

// checkObject re-hashes a stored object and compares it with the recorded digest and size.
func checkObject(ctx context.Context, st Getter, key, wantSHA256 string, wantSize int64) error {
	rc, err := st.Get(ctx, key)
	if err != nil {
		return fmt.Errorf("%w: %s: %w", ErrMissing, key, err)
	}
	defer rc.Close()
	err = CopyChecked(io.Discard, rc, key, wantSHA256, wantSize)
	if err != nil && !errors.Is(err, ErrDigestMismatch) {
		return fmt.Errorf("%w: %w", ErrMissing, err) // a read: io.Discard takes every write
	}
	return err
}

// CopyChecked copies the object stored at key, read from r, to w while hashing it, and returns
// nil exactly when it is wantSize bytes with SHA-256 wantSHA256: the one check of a stored file
// against its manifest (verify, get, logs). It reads at most one byte past wantSize, so an
// object longer than the manifest records costs its reader no more than the size recorded. The
// caller keeps or shows what w got only on nil. A mismatch wraps ErrDigestMismatch; any other
// error is r's or w's.
func CopyChecked(w io.Writer, r io.Reader, key, wantSHA256 string, wantSize int64) error {
	h := sha256.New()
	n, err := io.Copy(io.MultiWriter(w, h), io.LimitReader(r, max(wantSize, 0)+1))
	switch got := hex.EncodeToString(h.Sum(nil)); {
	case err != nil:
		return fmt.Errorf("copy %s: %w", key, err)
	case n > wantSize:
		return fmt.Errorf("%w: %s is longer than the %d bytes the manifest records", ErrDigestMismatch, key, wantSize)
	case got != wantSHA256 || n != wantSize:
		return fmt.Errorf("%w: %s is sha256 %s, %d bytes; the manifest records %s, %d bytes", ErrDigestMismatch, key, got, n, wantSHA256, wantSize)
	}
	return nil
}
