package submitcmd

import (
	"bytes"
	"cmp"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/boxcar-run/boxcar/internal/provenance"
	"github.com/boxcar-run/boxcar/internal/store"
)

// forgedTranscript is what a store writer without the signing key puts in a run's place.
const forgedTranscript = `{"type":"final","outcome":"succeeded","message":"FORGED: all checks passed"}` + "\n"

// TestLogsHoldsTheRunToItsSignature: logs shows a run's transcript only once the manifest's
// signature is checked with the keys get and verify use, and the transcript matches the
// digest and size the manifest records, as get does (the same flags, exit 8, nothing of the
// transcript shown when a check fails; with no key anywhere it says the signature was not
// checked). It printed whatever transcript the stored manifest named, so whoever could write
// the store, without the signing key, had logs print a transcript of their choosing (on main all 12
// rows failed, 4 showing "FORGED", a transcript replaced under a signed manifest among them).
func TestLogsHoldsTheRunToItsSignature(t *testing.T) {
	te := newTestEnv(t)
	ctx := t.Context()
	committed := func() string { return te.commitSucceeded(t) }
	transcriptKey := func(id string) string {
		return store.AttemptPrefix(id, testAttempt) + "transcript.jsonl"
	}
	signed := committed()
	forged := committed()
	te.forgeFile(t, forged, "transcript.jsonl", []byte(forgedTranscript), "")
	unsigned := committed()
	if err := te.st.Delete(ctx, provenance.SignatureKey(unsigned)); err != nil {
		t.Fatal(err)
	}
	replaced := committed() // the transcript replaced, the signed manifest left as it is
	if err := te.st.Put(ctx, transcriptKey(replaced), strings.NewReader(forgedTranscript), -1); err != nil {
		t.Fatal(err)
	}
	longer := committed() // the signed transcript with a line after it
	if err := te.st.Put(ctx, transcriptKey(longer), strings.NewReader("{}\n"+forgedTranscript), -1); err != nil {
		t.Fatal(err)
	}
	other, otherKey := committed(), t.TempDir()
	te.signWithAnotherKey(t, other, otherKey)
	otherPub := filepath.Join(otherKey, provenance.PublicKeyFile)
	noKeyHome := t.TempDir()
	const signedLine = "[-] {}" // commitRun's transcript, one empty event
	// The transcript is checked in a temporary file, which no row leaves behind.
	spools := t.TempDir()
	t.Setenv("TMPDIR", spools)
	tests := []struct {
		name   string
		args   []string
		home   string // BOXCAR_HOME; te.home when empty
		code   int
		shown  string // the transcript line shown; "" for no line of it
		stderr string
	}{
		{name: "signed", args: []string{signed}, shown: signedLine, stderr: "checked transcript.jsonl against the manifest's sha256 digest, a manifest signed by key"},
		{name: "forged manifest", args: []string{forged}, code: exitVerifyFailed, stderr: "signs a statement other than the stored manifest"},
		{name: "forged manifest, unsigned allowed", args: []string{forged, "--allow-unsigned"}, code: exitVerifyFailed, stderr: "bad signature"},
		{name: "signature removed", args: []string{unsigned}, code: exitVerifyFailed, stderr: "--allow-unsigned"},
		{name: "signature removed, unsigned allowed", args: []string{unsigned, "--allow-unsigned"}, shown: signedLine, stderr: "NOT CHECKED"},
		{name: "signed by another key", args: []string{other}, code: exitVerifyFailed, stderr: "the embedded worker's; give the signer's key with --public-key"},
		{name: "the other key given", args: []string{other, "--public-key", otherPub}, home: noKeyHome, shown: signedLine},
		{name: "another key given", args: []string{signed, "--public-key", otherPub}, code: exitVerifyFailed, stderr: "bad signature"},
		{name: "transcript replaced", args: []string{replaced}, code: exitVerifyFailed, stderr: "FAIL transcript.jsonl"},
		{name: "transcript replaced, no key anywhere", args: []string{replaced}, home: noKeyHome, code: exitVerifyFailed, stderr: "FAIL transcript.jsonl"},
		{name: "transcript longer", args: []string{longer}, code: exitVerifyFailed, stderr: "longer than the 3 bytes the manifest records"},
		{name: "no key anywhere", args: []string{forged}, home: noKeyHome, shown: "FORGED", stderr: "the signature was NOT CHECKED"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			home := cmp.Or(tt.home, te.home)
			stdout, stderr, err := te.runAs(t, home, append([]string{"logs"}, tt.args...)...)
			if exitCode(err) != tt.code || !strings.Contains(stderr+message(err), tt.stderr) {
				t.Errorf("exit %d (%v), want %d and %q\n%s", exitCode(err), err, tt.code, tt.stderr, stderr)
			}
			if left, err := os.ReadDir(spools); err != nil || len(left) > 0 {
				t.Errorf("logs left %d files in TMPDIR (%v)", len(left), err)
			}
			switch out := stdout; {
			case tt.shown == "" && (strings.Contains(out, signedLine) || strings.Contains(out, "FORGED")):
				t.Errorf("logs showed the transcript; want no line of it:\n%s", out)
			case !strings.Contains(out, tt.shown):
				t.Errorf("logs did not show %q:\n%s", tt.shown, out)
			}
		})
	}
}

// signWithAnotherKey replaces a run's envelope with one over the same manifest by a new key,
// whose files it writes into dir.
func (te *testEnv) signWithAnotherKey(t *testing.T, id, dir string) {
	t.Helper()
	ctx := t.Context()
	if _, err := provenance.WriteKeyPair(dir); err != nil {
		t.Fatal(err)
	}
	key, err := provenance.ReadPrivateKeyFile(filepath.Join(dir, provenance.PrivateKeyFile))
	if err != nil {
		t.Fatal(err)
	}
	manifest, err := readObject(ctx, te.st, provenance.ManifestKey(id), maxManifestBytes)
	if err != nil {
		t.Fatal(err)
	}
	env, err := provenance.Sign(ctx, manifest, key)
	if err != nil {
		t.Fatal(err)
	}
	if err := te.st.Put(ctx, store.SignatureKey(id), bytes.NewReader(env), int64(len(env))); err != nil {
		t.Fatal(err)
	}
}
