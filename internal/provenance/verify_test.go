package provenance_test

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"errors"
	"io"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/boxcar-run/boxcar/internal/provenance"
	"github.com/boxcar-run/boxcar/internal/store"
)

// run is a committed run in a file store, as the runner leaves it.
type run struct {
	store    *store.File
	priv     ed25519.PrivateKey
	pub      ed25519.PublicKey
	manifest []byte
}

var runFiles = map[string]string{
	"report.md":            "# Sales\nTotals per region.\n",
	"artifacts/totals.csv": "region,total\neu,10\n",
	"transcript.jsonl":     "{\"turn\":1}\n",
}

const inputData = "region,amount\neu,10\n"

// setup stores a run of sampleManifest, signed when signed is true.
func setup(t *testing.T, signed bool) *run {
	t.Helper()
	st, err := store.NewFile(filepath.Join(t.TempDir(), "store"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	r := &run{store: st}
	r.priv, r.pub = keys(t)

	m := sampleManifest(t)
	m.Inputs = []provenance.Input{{Name: "sales.csv", SHA256: sha(inputData), Size: int64(len(inputData))}}
	r.put(t, store.InputKey(sha(inputData)), inputData)
	var subjects []provenance.Subject
	for name, body := range runFiles {
		r.put(t, store.RunPrefix(jobID)+name, body)
		subjects = append(subjects, provenance.Subject{Name: name, SHA256: sha(body), Size: int64(len(body))})
	}
	r.manifest = build(t, m, subjects)
	if signed {
		r.put(t, store.SignatureKey(jobID), string(sign(t, r.manifest, r.priv)))
	}
	r.put(t, store.ManifestKey(jobID), string(r.manifest))
	return r
}

func (r *run) put(t *testing.T, key, body string) {
	t.Helper()
	if err := r.store.Put(t.Context(), key, strings.NewReader(body), int64(len(body))); err != nil {
		t.Fatal(err)
	}
}

func TestVerify(t *testing.T) {
	_, otherPub := keys(t)
	tests := []struct {
		name    string
		signed  bool
		usePub  bool
		wrong   bool // give another public key
		tamper  func(*testing.T, *run)
		wantErr []error  // each must be in the error; none means success
		failed  []string // names of the checks that fail
		skipped []string // names of the checks that are skipped
	}{
		{name: "signed, checked", signed: true, usePub: true},
		{name: "unsigned, no key", skipped: []string{"signature"}},
		{name: "signed, no key", signed: true, skipped: []string{"signature"}},
		{name: "unsigned, key given", usePub: true, wantErr: []error{provenance.ErrUnsigned, store.ErrNotFound}, failed: []string{"signature"}},
		{name: "wrong key", signed: true, usePub: true, wrong: true, wantErr: []error{provenance.ErrBadSignature}, failed: []string{"signature"}},
		{
			name: "tampered report", signed: true, usePub: true,
			tamper: func(t *testing.T, r *run) {
				r.put(t, store.RunPrefix(jobID)+"report.md", "# Sales\nTotals per region, forged.\n")
			},
			wantErr: []error{provenance.ErrDigestMismatch}, failed: []string{"subject report.md"},
		},
		{
			name: "tampered input", signed: true, usePub: true,
			tamper:  func(t *testing.T, r *run) { r.put(t, store.InputKey(sha(inputData)), "region,amount\neu,99\n") },
			wantErr: []error{provenance.ErrDigestMismatch}, failed: []string{"input sales.csv"},
		},
		{
			name: "truncated artifact",
			tamper: func(t *testing.T, r *run) {
				r.put(t, store.RunPrefix(jobID)+"artifacts/totals.csv", "region,total\n")
			},
			wantErr: []error{provenance.ErrDigestMismatch}, failed: []string{"subject artifacts/totals.csv"}, skipped: []string{"signature"},
		},
		{
			name: "manifest replaced after signing", signed: true, usePub: true,
			tamper: func(t *testing.T, r *run) {
				// A forger rewrites the manifest to match a forged report but cannot re-sign it.
				forged := "# forged\n"
				r.put(t, store.RunPrefix(jobID)+"report.md", forged)
				r.put(t, store.ManifestKey(jobID), string(bytes.Replace(r.manifest, []byte(sha(runFiles["report.md"])), []byte(sha(forged)), 1)))
			},
			wantErr: []error{provenance.ErrBadSignature}, failed: []string{"signature", "subject report.md"},
		},
		{
			name: "manifest of another job", signed: true, usePub: true,
			tamper: func(t *testing.T, r *run) {
				other := strings.ReplaceAll(string(r.manifest), jobID, "20261202t101500-000000000000")
				r.put(t, store.ManifestKey(jobID), other)
			},
			wantErr: []error{provenance.ErrInvalid}, failed: []string{"manifest"},
		},
		{
			name:    "not a manifest",
			tamper:  func(t *testing.T, r *run) { r.put(t, store.ManifestKey(jobID), `{"hello":"world"}`) },
			wantErr: []error{provenance.ErrInvalid}, failed: []string{"manifest"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := setup(t, tt.signed)
			if tt.tamper != nil {
				tt.tamper(t, r)
			}
			var pub ed25519.PublicKey
			switch {
			case tt.wrong:
				pub = otherPub
			case tt.usePub:
				pub = r.pub
			}
			report, err := provenance.Verify(t.Context(), r.store, jobID, pub)
			for _, want := range tt.wantErr {
				if !errors.Is(err, want) {
					t.Errorf("Verify error = %v, want %v in it", err, want)
				}
			}
			if len(tt.wantErr) == 0 && err != nil {
				t.Errorf("Verify error = %v, want nil", err)
			}
			if report.OK() != (err == nil) {
				t.Errorf("report.OK() = %t with error %v", report.OK(), err)
			}
			var failed, skipped []string
			for _, c := range report.Checks {
				switch {
				case c.Skipped:
					skipped = append(skipped, c.Name)
				case !c.OK:
					failed = append(failed, c.Name)
					if c.Err == nil || c.Reason == "" {
						t.Errorf("failed check %s has no error or reason", c.Name)
					}
				}
			}
			if !slices.Equal(failed, tt.failed) || !slices.Equal(skipped, tt.skipped) {
				t.Errorf("failed checks %q, skipped %q; want %q, %q\n%+v", failed, skipped, tt.failed, tt.skipped, report.Checks)
			}
			if len(failed) == 0 && len(tt.failed) == 0 && tt.name != "not a manifest" {
				// Every subject and input was looked at.
				if got, want := len(report.Checks), 2+len(runFiles)+1; got != want {
					t.Errorf("%d checks, want %d: %+v", got, want, report.Checks)
				}
			}
			if wantKey := tt.signed && tt.usePub && !slices.Contains(failed, "signature") && !slices.Contains(failed, "manifest"); (report.KeyID != "") != wantKey {
				t.Errorf("report.KeyID = %q, want one: %t", report.KeyID, wantKey)
			}
		})
	}
}

func TestVerifyMissing(t *testing.T) {
	r := setup(t, false)
	// No manifest at all: the run never committed.
	_, err := provenance.Verify(t.Context(), r.store, "20261202t101500-ffffffffffff", nil)
	if !errors.Is(err, provenance.ErrMissing) || !errors.Is(err, store.ErrNotFound) {
		t.Errorf("Verify of an uncommitted run: error = %v, want ErrMissing and store.ErrNotFound", err)
	}
	// A subject that is gone: build a manifest naming one more file than the store holds.
	m := sampleManifest(t)
	m.Inputs = nil
	body := runFiles["report.md"]
	manifest := build(t, m, []provenance.Subject{
		{Name: "report.md", SHA256: sha(body), Size: int64(len(body))},
		{Name: "artifacts/gone.csv", SHA256: sha("gone"), Size: 4},
	})
	r.put(t, store.ManifestKey(jobID), string(manifest))
	report, err := provenance.Verify(t.Context(), r.store, jobID, nil)
	if !errors.Is(err, provenance.ErrMissing) || !errors.Is(err, store.ErrNotFound) {
		t.Errorf("Verify with a missing artifact: error = %v, want ErrMissing and store.ErrNotFound", err)
	}
	if report.OK() {
		t.Errorf("report.OK() with a missing artifact")
	}
	if _, err := provenance.Verify(t.Context(), r.store, "../etc", nil); !errors.Is(err, provenance.ErrInvalid) {
		t.Errorf("Verify of a bad job id: error = %v, want ErrInvalid", err)
	}
}

// endless serves one key as an object that never ends and counts what was read of it; every
// other key from the store under it.
type endless struct {
	provenance.Getter
	key  string
	read int64
}

func (e *endless) Get(ctx context.Context, key string) (io.ReadCloser, error) {
	if key != e.key {
		return e.Getter.Get(ctx, key)
	}
	return io.NopCloser(readerFunc(func(p []byte) (int, error) {
		clear(p)
		e.read += int64(len(p))
		return len(p), nil
	})), nil
}

type readerFunc func([]byte) (int, error)

func (f readerFunc) Read(p []byte) (int, error) { return f(p) }

// TestVerifyReadsNoMoreThanRecorded: an object longer than its subject records fails, read to
// no more than the size recorded and a little: a store writer can make a file of any length,
// and verify hashed every byte of it, so one that never ends kept verify reading for ever (on
// main this test did not end).
func TestVerifyReadsNoMoreThanRecorded(t *testing.T) {
	r := setup(t, true)
	st := &endless{Getter: r.store, key: store.RunPrefix(jobID) + "report.md"}
	report, err := provenance.Verify(t.Context(), st, jobID, r.pub)
	if !errors.Is(err, provenance.ErrDigestMismatch) || report.OK() {
		t.Errorf("Verify of an endless report: %v; want a digest mismatch", err)
	}
	if limit := int64(len(runFiles["report.md"])) + 1; st.read > limit {
		t.Errorf("Verify read %d bytes of the report; want at most %d", st.read, limit)
	}
}
