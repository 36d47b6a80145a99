package provenance

import (
	"context"
	"errors"
	"strings"

	"github.com/boxcar-run/boxcar/internal/store"
)

// Signature states of a Verdict.
const (
	SignatureVerified   = "verified"
	SignatureFailed     = "failed"
	SignatureNotChecked = "not_checked"
)

// Results of a VerdictCheck.
const (
	ResultOK      = "ok"
	ResultFail    = "fail"
	ResultSkipped = "skipped"
)

// Policy says what a verdict demands beyond the checks themselves.
type Policy struct {
	// AllowUnsigned accepts a run whose signature could not be checked (no key to check it
	// with, or no envelope and no key). By default such a run fails: verification fails
	// closed. A signature that is present and checked must verify either way.
	AllowUnsigned bool
}

// VerdictCheck is one check of a Report as the verdict judged it, stable for scripts.
type VerdictCheck struct {
	File   string `json:"file"`   // what was checked: manifest.json, manifest.dsse.json, report.md, input sales.csv …
	Key    string `json:"key"`    // the object's key in the store
	Check  string `json:"check"`  // the Report's name for the check: "manifest", "subject report.md", "input sales.csv"
	Result string `json:"result"` // ResultOK, ResultFail or ResultSkipped
	Reason string `json:"reason"`
	// SignatureRequired marks a signature check failed only because no key was given and
	// Policy.AllowUnsigned was not set.
	SignatureRequired bool `json:"-"`

	Err error `json:"-"`
}

// Verdict is the decision on one run: Verified is true exactly when there were checks, none
// failed and every object could be read.
type Verdict struct {
	ID        string         `json:"id"`
	Verified  bool           `json:"verified"`
	Signature string         `json:"signature"` // SignatureVerified, SignatureFailed or SignatureNotChecked
	KeyID     string         `json:"key_id,omitempty"`
	KeyName   string         `json:"key_name,omitempty"` // the signer's name in the keyring
	Checks    []VerdictCheck `json:"checks"`
	// Failed names the files whose check failed; Unreadable those the store could not serve
	// for another reason than their absence: they prove nothing either way, so the run is
	// not verified, but nothing was found wrong.
	Failed     []string `json:"-"`
	Unreadable []string `json:"-"`
}

// Decide judges a Report under a policy. It is the one place that says what verifies.
func Decide(r Report, p Policy) Verdict {
	v := Verdict{ID: r.JobID, Signature: SignatureNotChecked, KeyID: r.KeyID, KeyName: r.KeyName}
	for _, c := range r.Checks {
		file, key := CheckObject(c.Name, r.JobID, r.Statement)
		vc := VerdictCheck{File: file, Key: key, Check: c.Name, Reason: c.Reason, Err: c.Err}
		switch {
		case c.OK:
			vc.Result = ResultOK
		case c.Skipped:
			vc.Result = ResultSkipped
		default:
			vc.Result = ResultFail
		}
		if c.Name == "signature" {
			switch {
			case c.OK:
				v.Signature = SignatureVerified
			case c.Skipped && !p.AllowUnsigned:
				vc.Result = ResultFail
				vc.Reason = "not checked: no public key, and a signature is required"
				vc.SignatureRequired = true
				vc.Err = ErrUnsigned
				v.Signature = SignatureFailed
			case c.Skipped:
			default:
				v.Signature = SignatureFailed
			}
		}
		v.Checks = append(v.Checks, vc)
	}
	for _, c := range v.Checks {
		if c.Result != ResultFail {
			continue
		}
		if errors.Is(c.Err, ErrMissing) && !errors.Is(c.Err, store.ErrNotFound) {
			v.Unreadable = append(v.Unreadable, c.File)
			continue
		}
		v.Failed = append(v.Failed, c.File)
	}
	v.Verified = len(v.Checks) > 0 && len(v.Failed) == 0 && len(v.Unreadable) == 0
	return v
}

// CheckObject names what a check of Verify looked at, for people ("report.md",
// "input sales.csv"), and the store key of that object.
func CheckObject(name, jobID string, stmt Statement) (file, key string) {
	switch {
	case name == "manifest":
		return manifestName, ManifestKey(jobID)
	case name == "signature":
		return signatureName, SignatureKey(jobID)
	case strings.HasPrefix(name, "subject "):
		file = strings.TrimPrefix(name, "subject ")
		for _, s := range stmt.Subjects {
			if s.Name == file {
				return file, SubjectKey(jobID, s)
			}
		}
		return file, runKey(jobID, file)
	case strings.HasPrefix(name, "input "):
		in := strings.TrimPrefix(name, "input ")
		for _, i := range stmt.Predicate.Inputs {
			if i.Name == in {
				return name, inputKey(i.SHA256)
			}
		}
	}
	return name, ""
}

// ManifestKey and SignatureKey are where a run's manifest and its envelope are stored.
func ManifestKey(jobID string) string  { return runKey(jobID, manifestName) }
func SignatureKey(jobID string) string { return runKey(jobID, signatureName) }

// SubjectKey is where the object a subject describes is stored: its Path inside the run's
// folder (the attempt folder of the attempt that committed), or its Name for runs committed
// before attempt folders. Readers of a run (get, verify) resolve every subject through it, so
// the layout is decided here and in the store.
func SubjectKey(jobID string, s Subject) string {
	if s.Path != "" {
		return runKey(jobID, s.Path)
	}
	return runKey(jobID, s.Name)
}

// AttemptSignatureKey is where the attempt that committed the run left the manifest's envelope
// before committing: "manifest.dsse.json" in the attempt folder that holds the subjects. It is
// "" for runs from before attempt folders, or when the subjects do not share one folder.
func AttemptSignatureKey(jobID string, stmt Statement) string {
	folder := ""
	for _, s := range stmt.Subjects {
		parts := strings.SplitN(s.Path, "/", 3)
		if len(parts) < 3 || parts[0] != "attempts" || parts[1] == "" {
			return ""
		}
		if f := parts[0] + "/" + parts[1] + "/"; folder == "" {
			folder = f
		} else if f != folder {
			return ""
		}
	}
	if folder == "" {
		return ""
	}
	return runKey(jobID, folder+signatureName)
}

// Lister is the store method Unlisted lists with. Any store.Store satisfies it.
type Lister = store.Lister

// MaxUnlisted is the most objects Unlisted reports that the manifest does not name. Whoever
// may write the store may put any number of objects under a run's folder, and a reader that
// listed them all (verify, get) paged through, held and printed each; a run a worker committed
// holds none beyond the leftovers of its other attempts.
const MaxUnlisted = 100

// Unlisted is UnlistedMore without more: at most MaxUnlisted of the objects the manifest does
// not name.
func Unlisted(ctx context.Context, st Lister, jobID string, stmt Statement) ([]string, error) {
	unlisted, _, err := UnlistedMore(ctx, st, jobID, stmt)
	return unlisted, err
}

// UnlistedMore returns objects under the run's folder that the manifest does not name, other
// than the manifest and its signature (and the copy of it the committing attempt left in its
// folder), relative to the folder: nothing vouches for them. It lists at most the objects the
// manifest names and MaxUnlisted more (store.ListAtMost), so more says the folder holds others
// not returned, whatever their number.
func UnlistedMore(ctx context.Context, st Lister, jobID string, stmt Statement) (unlisted []string, more bool, err error) {
	prefix := runKey(jobID, "")
	named := map[string]bool{ManifestKey(jobID): true, SignatureKey(jobID): true, AttemptSignatureKey(jobID, stmt): true}
	for _, s := range stmt.Subjects {
		named[SubjectKey(jobID, s)] = true
	}
	objects, more, err := store.ListAtMost(ctx, st, prefix, len(named)+MaxUnlisted)
	if err != nil {
		return nil, false, err
	}
	for _, o := range objects {
		switch {
		case named[o.Key]:
		case len(unlisted) == MaxUnlisted:
			more = true
		default:
			unlisted = append(unlisted, strings.TrimPrefix(o.Key, prefix))
		}
	}
	return unlisted, more, nil
}
