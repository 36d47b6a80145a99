package provenance

import (
	"context"
	"errors"
	"fmt"
	"path"
	"slices"
	"testing"

	"github.com/boxcar-run/boxcar/internal/store"
)

func TestDecide(t *testing.T) {
	const id = "20261202t101500-abcdef012345"
	stmt := Statement{
		Subjects:  []Subject{{Name: "report.md", SHA256: "aa", Size: 1}},
		Predicate: Manifest{Inputs: []Input{{Name: "sales.csv", SHA256: "bb", Size: 2}}},
	}
	ok := func(name string) Check { return Check{Name: name, OK: true} }
	manifest, signature, report, input := ok("manifest"), ok("signature"), ok("subject report.md"), ok("input sales.csv")
	skippedSig := Check{Name: "signature", Skipped: true, Reason: "no public key given"}
	badSig := Check{Name: "signature", Err: ErrBadSignature}
	changed := Check{Name: "subject report.md", Err: fmt.Errorf("%w: report.md", ErrDigestMismatch)}
	gone := Check{Name: "subject report.md", Err: fmt.Errorf("%w: %w", ErrMissing, store.ErrNotFound)}
	unreachable := Check{Name: "input sales.csv", Err: fmt.Errorf("%w: %w", ErrMissing, errors.New("connection refused"))}
	noManifest := Check{Name: "manifest", Err: fmt.Errorf("%w: %w", ErrMissing, store.ErrNotFound)}

	tests := []struct {
		name       string
		checks     []Check
		allow      bool // Policy.AllowUnsigned
		verified   bool
		signature  string
		failed     []string
		unreadable []string
	}{
		{"all good", []Check{manifest, signature, report, input}, false, true, SignatureVerified, nil, nil},
		{"no key, unsigned allowed", []Check{manifest, skippedSig, report, input}, true, true, SignatureNotChecked, nil, nil},
		{"no key fails closed", []Check{manifest, skippedSig, report, input}, false, false, SignatureFailed, []string{"manifest.dsse.json"}, nil},
		{"no key, changed file, unsigned allowed", []Check{manifest, skippedSig, changed, input}, true, false, SignatureNotChecked, []string{"report.md"}, nil},
		{"bad signature", []Check{manifest, badSig, report, input}, false, false, SignatureFailed, []string{"manifest.dsse.json"}, nil},
		{"changed file", []Check{manifest, signature, changed, input}, false, false, SignatureVerified, []string{"report.md"}, nil},
		{"missing file", []Check{manifest, signature, gone, input}, false, false, SignatureVerified, []string{"report.md"}, nil},
		{"store unreachable", []Check{manifest, signature, report, unreachable}, false, false, SignatureVerified, nil, []string{"input sales.csv"}},
		{"no manifest", []Check{noManifest}, false, false, SignatureNotChecked, []string{"manifest.json"}, nil},
		{"no checks", nil, false, false, SignatureNotChecked, nil, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			v := Decide(Report{JobID: id, Statement: stmt, Checks: tt.checks}, Policy{AllowUnsigned: tt.allow})
			if v.Verified != tt.verified || v.Signature != tt.signature || !slices.Equal(v.Failed, tt.failed) || !slices.Equal(v.Unreadable, tt.unreadable) {
				t.Errorf("Decide = verified %v, signature %s, failed %v, unreadable %v; want %v, %s, %v, %v",
					v.Verified, v.Signature, v.Failed, v.Unreadable, tt.verified, tt.signature, tt.failed, tt.unreadable)
			}
		})
	}
}

func TestCheckObject(t *testing.T) {
	const id = "20261202t101500-abcdef012345"
	stmt := Statement{Predicate: Manifest{Inputs: []Input{{Name: "sales.csv", SHA256: "bb"}}}}
	tests := []struct{ check, file, key string }{
		{"manifest", "manifest.json", store.ManifestKey(id)},
		{"signature", "manifest.dsse.json", store.SignatureKey(id)},
		{"subject artifacts/a.csv", "artifacts/a.csv", store.RunPrefix(id) + "artifacts/a.csv"},
		{"input sales.csv", "input sales.csv", store.InputKey("bb")},
	}
	for _, tt := range tests {
		if file, key := CheckObject(tt.check, id, stmt); file != tt.file || key != tt.key {
			t.Errorf("CheckObject(%q) = %s, %s; want %s, %s", tt.check, file, key, tt.file, tt.key)
		}
	}
}

func TestAttemptSignatureKey(t *testing.T) {
	const id = "20261202t101500-abcdef012345"
	subject := func(p string) Subject { return Subject{Name: path.Base(p), Path: p} }
	tests := []struct {
		name     string
		subjects []Subject
		want     string
	}{
		{"one folder", []Subject{subject("attempts/2-0a1b2c3d/report.md"), subject("attempts/2-0a1b2c3d/artifacts/t.csv")}, "runs/" + id + "/attempts/2-0a1b2c3d/manifest.dsse.json"},
		{"two folders", []Subject{subject("attempts/2-0a1b2c3d/report.md"), subject("attempts/3-0a1b2c3d/t.csv")}, ""},
		{"before attempt folders", []Subject{{Name: "report.md"}}, ""},
		{"outside attempts", []Subject{subject("other/2-0a1b2c3d/report.md")}, ""},
		{"empty folder name", []Subject{subject("attempts//report.md")}, ""},
		{"no subjects", nil, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := AttemptSignatureKey(id, Statement{Subjects: tt.subjects}); got != tt.want {
				t.Errorf("AttemptSignatureKey = %q, want %q", got, tt.want)
			}
		})
	}
}

// plantedFolder is a store whose run folder holds the objects a manifest names and planted
// more that a writer of the store put beside them, made as they are listed; served counts the
// objects it handed out.
type plantedFolder struct {
	named   []string
	planted int
	served  int
}

func (p *plantedFolder) object(i int) store.ObjectInfo {
	if i < len(p.named) {
		return store.ObjectInfo{Key: p.named[i]}
	}
	return store.ObjectInfo{Key: fmt.Sprintf("runs/%s/planted/%09d", unlistedID, i)}
}

func (p *plantedFolder) List(_ context.Context, _ string) ([]store.ObjectInfo, error) {
	return p.objects(len(p.named) + p.planted), nil
}

func (p *plantedFolder) ListAtMost(_ context.Context, _ string, n int) ([]store.ObjectInfo, bool, error) {
	total := len(p.named) + p.planted
	return p.objects(min(n, total)), n < total, nil
}

func (p *plantedFolder) objects(n int) []store.ObjectInfo {
	out := make([]store.ObjectInfo, 0, n)
	for i := range n {
		out = append(out, p.object(i))
	}
	p.served += n
	return out
}

const unlistedID = "20261202t101500-abcdef012345"

// TestUnlistedListsABoundedFolder: Unlisted reads no more of a run's folder than the objects
// the manifest names and MaxUnlisted more, however many a writer of the store planted there,
// and says there are more. It listed the folder whole (a million planted objects: a million
// served, a million returned, for verify and get to print).
func TestUnlistedListsABoundedFolder(t *testing.T) {
	stmt := Statement{Subjects: []Subject{
		{Name: "report.md", Path: "attempts/1-a/report.md"},
		{Name: "transcript.jsonl", Path: "attempts/1-a/transcript.jsonl"},
	}}
	named := []string{ManifestKey(unlistedID), SignatureKey(unlistedID), AttemptSignatureKey(unlistedID, stmt)}
	for _, s := range stmt.Subjects {
		named = append(named, SubjectKey(unlistedID, s))
	}
	bound := len(named) + MaxUnlisted + 1
	for _, tt := range []struct {
		planted  int
		unlisted int
		more     bool
	}{
		{0, 0, false},
		{3, 3, false},
		{MaxUnlisted, MaxUnlisted, false},
		{MaxUnlisted + 1, MaxUnlisted, true},
		{1_000_000, MaxUnlisted, true},
	} {
		t.Run(fmt.Sprint(tt.planted), func(t *testing.T) {
			st := &plantedFolder{named: named, planted: tt.planted}
			got, more, err := UnlistedMore(t.Context(), st, unlistedID, stmt)
			if err != nil {
				t.Fatal(err)
			}
			if len(got) != tt.unlisted || more != tt.more || st.served > bound {
				t.Errorf("%d planted: %d unlisted, more %v, %d objects listed; want %d, more %v, at most %d listed",
					tt.planted, len(got), more, st.served, tt.unlisted, tt.more, bound)
			}
		})
	}
}
