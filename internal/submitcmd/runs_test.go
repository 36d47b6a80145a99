package submitcmd

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"maps"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/boxcar-run/boxcar/examples"
	"github.com/boxcar-run/boxcar/internal/config"
	"github.com/boxcar-run/boxcar/internal/job"
	"github.com/boxcar-run/boxcar/internal/provenance"
	"github.com/boxcar-run/boxcar/internal/store"
)

// testAttempt is the attempt folder of the runs these tests commit, as a worker names one.
const testAttempt = "1-0a1b2c3d"

func hexSum(data []byte) string {
	sum := sha256.Sum256(data)
	return hex.EncodeToString(sum[:])
}

// commitRun stores a committed run as a worker would: input, report, transcript, manifest and,
// when signed, its envelope signed with the key in $BOXCAR_HOME/keys.
// commitSucceeded is commitRun of a signed run with the status a worker leaves: succeeded,
// naming the manifest.
func (te *testEnv) commitSucceeded(t *testing.T, change ...func(*provenance.Manifest)) string {
	t.Helper()
	id := te.commitRun(t, true, change...)
	te.setState(t, id, func(s *job.Status) { s.State, s.Manifest = job.StateSucceeded, provenance.ManifestKey(id) })
	return id
}

func (te *testEnv) commitRun(t *testing.T, signed bool, change ...func(*provenance.Manifest)) string {
	t.Helper()
	return te.commitRunOf(t, signed, nil, change...)
}

// commitRunOf is commitRun with the artifacts given: name (under artifacts/) to content.
func (te *testEnv) commitRunOf(t *testing.T, signed bool, artifacts map[string][]byte, change ...func(*provenance.Manifest)) string {
	t.Helper()
	files := map[string][]byte{}
	for name, data := range artifacts {
		files["artifacts/"+name] = data
	}
	id := job.NewID()
	te.commitRunAs(t, id, signed, files, change...)
	return id
}

// commitRunAs is commitRun of job id with the files given (a name in the run to its content)
// in place of, or beside, its report and transcript.
func (te *testEnv) commitRunAs(t *testing.T, id string, signed bool, given map[string][]byte, change ...func(*provenance.Manifest)) {
	t.Helper()
	ctx := t.Context()
	cfg, err := config.Parse(examples.Config)
	if err != nil {
		t.Fatal(err)
	}
	p, err := cfg.Profile("csv-analyst")
	if err != nil {
		t.Fatal(err)
	}
	input := []byte("region,total\nnorth,3\n")
	files := map[string][]byte{"report.md": []byte("# Totals\nnorth: 3\n"), "transcript.jsonl": []byte("{}\n")}
	maps.Copy(files, given)
	put := func(key string, data []byte) {
		if err := te.st.Put(ctx, key, bytes.NewReader(data), int64(len(data))); err != nil {
			t.Fatal(err)
		}
	}
	put(store.InputKey(hexSum(input)), input)
	var subjects []provenance.Subject
	for name, data := range files {
		s := provenance.Subject{Name: name, SHA256: hexSum(data), Size: int64(len(data)), Path: "attempts/" + testAttempt + "/" + name}
		put(provenance.SubjectKey(id, s), data)
		subjects = append(subjects, s)
	}
	now := time.Now().UTC()
	m := provenance.Manifest{
		Job:       provenance.Job{ID: id, Profile: "csv-analyst", Task: "Summarise", SubmittedAt: now},
		Inputs:    []provenance.Input{{Name: "sales.csv", SHA256: hexSum(input), Size: int64(len(input))}},
		Profile:   provenance.Profile{Name: "csv-analyst", Spec: p},
		Outcome:   provenance.Outcome{State: job.StateSucceeded},
		Timings:   provenance.Timings{QueuedAt: now, StartedAt: now, FinishedAt: now.Add(time.Second)},
		ToolCalls: []provenance.ToolCall{{ID: "call_1", Tool: "csv_stats", ExitCode: 0, DurationMS: 3}},
		Attempt:   1,
		Worker:    provenance.WorkerInfo("worker-1"),
	}
	for _, c := range change {
		c(&m)
	}
	manifest, err := provenance.Build(m, subjects)
	if err != nil {
		t.Fatal(err)
	}
	put(provenance.ManifestKey(id), manifest)
	if signed {
		keys := filepath.Join(te.home, "keys")
		if _, err := os.Stat(filepath.Join(keys, provenance.PrivateKeyFile)); os.IsNotExist(err) {
			if _, err := provenance.WriteKeyPair(keys); err != nil {
				t.Fatal(err)
			}
		}
		key, err := provenance.ReadPrivateKeyFile(filepath.Join(keys, provenance.PrivateKeyFile))
		if err != nil {
			t.Fatal(err)
		}
		env, err := provenance.Sign(ctx, manifest, key)
		if err != nil {
			t.Fatal(err)
		}
		put(provenance.SignatureKey(id), env)
	}
}

func TestVerify(t *testing.T) {
	te := newTestEnv(t)
	signed := te.commitRun(t, true)
	unsigned := te.commitRun(t, false)
	tampered := te.commitRun(t, true)
	if err := te.st.Put(t.Context(), store.AttemptPrefix(tampered, testAttempt)+"report.md", strings.NewReader("# Totals\nnorth: 4\n"), -1); err != nil {
		t.Fatal(err)
	}
	tamperedUnsigned := te.commitRun(t, false)
	if err := te.st.Put(t.Context(), store.AttemptPrefix(tamperedUnsigned, testAttempt)+"report.md", strings.NewReader("# Totals\nnorth: 4\n"), -1); err != nil {
		t.Fatal(err)
	}
	extra := te.commitRun(t, true)
	if err := te.st.Put(t.Context(), store.RunPrefix(extra)+"artifacts/planted.sh", strings.NewReader("rm -rf /"), -1); err != nil {
		t.Fatal(err)
	}
	noKeyHome := t.TempDir()
	tests := []struct {
		name string
		args []string
		home string // BOXCAR_HOME; te.home when empty
		code int
		want []string
	}{
		{"signed", []string{signed}, "", 0, []string{"verified: every file matches the manifest, and the manifest is signed by key", "ok    report.md", "input sales.csv"}},
		{"signed json", []string{signed, "--output", "json"}, "", 0, []string{`"verified":true`, `"signature":"verified"`, `"public_key":"` + filepath.Join(te.home, "keys", "signing.pub")}},
		{"unsigned with a key", []string{unsigned}, "", exitVerifyFailed, []string{"FAIL  manifest.dsse.json", "NOT VERIFIED"}},
		{"no key, unsigned allowed", []string{signed, "--allow-unsigned"}, noKeyHome, 0, []string{"no public key", "SIGNATURE WAS NOT CHECKED", "give --keyring FILE or --public-key FILE to check it"}},
		{"no key fails closed", []string{signed}, noKeyHome, exitVerifyFailed, []string{"FAIL  manifest.dsse.json", "--allow-unsigned accepts"}},
		{"unsigned, no key", []string{unsigned}, noKeyHome, exitVerifyFailed, []string{"FAIL  manifest.dsse.json"}},
		{"unsigned, unsigned allowed", []string{unsigned, "--allow-unsigned"}, noKeyHome, 0, []string{"SIGNATURE WAS NOT CHECKED"}},
		{"unsigned and tampered", []string{tamperedUnsigned}, noKeyHome, exitVerifyFailed, []string{"FAIL  manifest.dsse.json", "FAIL  report.md"}},
		{"unsigned and tampered, unsigned allowed", []string{tamperedUnsigned, "--allow-unsigned"}, noKeyHome, exitVerifyFailed, []string{"FAIL  report.md"}},
		{"explicit key", []string{signed, "--public-key", filepath.Join(te.home, "keys", "signing.pub")}, noKeyHome, 0, []string{"signed by key"}},
		{"tampered", []string{tampered}, "", exitVerifyFailed, []string{"FAIL  report.md", "digest mismatch"}},
		{"unlisted", []string{extra, "--output", "json"}, "", 0, []string{`"unlisted":["artifacts/planted.sh"]`}},
		{"not committed", []string{job.NewID()}, "", 1, nil}, // TestReadersOfARunNotCommittedYet
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			home := te.home
			if tt.home != "" {
				home = tt.home
			}
			stdout, _, err := te.runAs(t, home, append([]string{"verify"}, tt.args...)...)
			if exitCode(err) != tt.code {
				t.Errorf("exit %d (%v), want %d\n%s", exitCode(err), err, tt.code, stdout)
			}
			for _, w := range tt.want {
				if !strings.Contains(stdout, w) {
					t.Errorf("output lacks %q:\n%s", w, stdout)
				}
			}
		})
	}
}

// TestReadersRefuseARunOfAnotherTenant: the signed run of a job of tenant alpha's, copied with
// its objects into tenant default's folder (by anyone who can write there: a submitter of
// default on a shared file store, or with default's store credentials), is no run of
// default's: verify fails it (exit 8), get downloads nothing and logs shows nothing of it.
// They used to check the job id the manifest records against the folder's, not the tenant,
// though the manifest records and signs it. A run that records tenant default, or none
// (committed before tenants, all of whose jobs were default's), is default's.
func TestReadersRefuseARunOfAnotherTenant(t *testing.T) {
	te := newTestEnv(t)
	tenant := func(name string) func(*provenance.Manifest) {
		return func(m *provenance.Manifest) {
			m.Tenant = provenance.Tenant{Name: name, Profiles: []string{"csv-analyst"}}
		}
	}
	alphas := te.commitSucceeded(t, tenant("alpha"))
	defaults := te.commitSucceeded(t, tenant(job.DefaultTenant))
	const refused = "it records a job of tenant alpha, not of default"
	tests := []struct {
		name string
		args []string
		code int
		want string // in stdout or the error
	}{
		{"verify", []string{"verify", alphas}, exitVerifyFailed, refused},
		{"get", []string{"get", alphas, "--out", t.TempDir()}, exitVerifyFailed, refused},
		{"logs", []string{"logs", alphas}, exitVerifyFailed, refused},
		{"verify of default's", []string{"verify", defaults}, 0, "verified: every file matches the manifest"},
		{"get of default's", []string{"get", defaults, "--out", t.TempDir()}, 0, "report.md"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			stdout, _, err := te.submit(t, tt.args...)
			if exitCode(err) != tt.code || !strings.Contains(stdout+message(err), tt.want) {
				t.Errorf("%s: exit %d (%v), want %d and %q\n%s", strings.Join(tt.args, " "), exitCode(err), err, tt.code, tt.want, stdout)
			}
		})
	}
}

func TestGet(t *testing.T) {
	te := newTestEnv(t)
	id := te.commitRun(t, true)
	out := t.TempDir()
	stdout, stderr, err := te.submit(t, "get", id, "--out", out)
	if err != nil {
		t.Fatalf("get: %v\n%s", err, stderr)
	}
	for _, name := range []string{"report.md", "transcript.jsonl", "manifest.json", "manifest.dsse.json"} {
		if _, err := os.Stat(filepath.Join(out, name)); err != nil || !strings.Contains(stdout, filepath.Join(out, name)) {
			t.Errorf("get did not download %s: %v\n%s", name, err, stdout)
		}
	}
	if data, _ := os.ReadFile(filepath.Join(out, "report.md")); string(data) != "# Totals\nnorth: 3\n" {
		t.Errorf("report.md = %q", data)
	}

	if err := te.st.Put(t.Context(), store.AttemptPrefix(id, testAttempt)+"report.md", strings.NewReader("forged"), -1); err != nil {
		t.Fatal(err)
	}
	out2 := t.TempDir()
	_, stderr, err = te.submit(t, "get", id, "--out", out2)
	if exitCode(err) != exitVerifyFailed || !strings.Contains(stderr, "FAIL report.md") {
		t.Errorf("get of a tampered run: exit %d %v\n%s", exitCode(err), err, stderr)
	}
	if _, err := os.Stat(filepath.Join(out2, "report.md")); !os.IsNotExist(err) {
		t.Errorf("the tampered report was kept: %v", err)
	}

	missing := job.NewID()
	if _, _, err := te.submit(t, "get", missing, "--out", t.TempDir()); exitCode(err) != 1 || !strings.Contains(message(err), "no results for job "+missing) {
		t.Errorf("get of a job without results: %v", err)
	}
	if err := te.st.Put(t.Context(), store.AttemptPrefix(missing, testAttempt)+"report.md", strings.NewReader("x"), -1); err != nil {
		t.Fatal(err)
	}
	if _, _, err := te.submit(t, "get", missing, "--out", t.TempDir()); exitCode(err) != 1 || !strings.Contains(message(err), "an attempt's objects and no manifest") {
		t.Errorf("get of an uncommitted run: %v", err)
	}
	if err := te.st.Put(t.Context(), store.ManifestKey(missing), strings.NewReader("{}"), -1); err != nil {
		t.Fatal(err)
	}
	if _, _, err := te.submit(t, "get", missing, "--out", t.TempDir()); exitCode(err) != exitVerifyFailed || !strings.Contains(message(err), "cannot be trusted") {
		t.Errorf("get of a run with a bad manifest: %v", err)
	}
}

func TestManifest(t *testing.T) {
	te := newTestEnv(t)
	id := te.commitRun(t, false)
	stdout, _, err := te.submit(t, "manifest", id)
	for _, w := range []string{"job:       " + id + " (profile csv-analyst, attempt 1)", "outcome:   succeeded", "input:     sales.csv", "tool  1:   csv_stats", "subject:   report.md"} {
		if err != nil || !strings.Contains(stdout, w) {
			t.Errorf("manifest lacks %q: %v\n%s", w, err, stdout)
		}
	}
	stdout, _, err = te.submit(t, "manifest", id, "--output", "json")
	stored, _ := readObject(t.Context(), te.st, provenance.ManifestKey(id), maxManifestBytes)
	if err != nil || stdout != string(stored)+"\n" {
		t.Errorf("manifest --output json is not the stored manifest: %v\n%s", err, stdout)
	}
	if _, _, err := te.submit(t, "manifest", job.NewID()); exitCode(err) != 1 || !strings.Contains(message(err), "no committed run") {
		t.Errorf("manifest of a job without a run: %v", err)
	}
}

func TestKeygen(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "keys")
	stdout, _, err := noEnv(t, "keygen", "--out", dir)
	if err != nil || !strings.Contains(stdout, "private key: "+filepath.Join(dir, "signing.key")) || !strings.Contains(stdout, "key id:") {
		t.Fatalf("keygen: %v\n%s", err, stdout)
	}
	if fi, err := os.Stat(filepath.Join(dir, "signing.key")); err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("signing.key: %v, %v; want mode 0600", fi, err)
	}
	if _, err := provenance.ReadPublicKeyFile(filepath.Join(dir, "signing.pub")); err != nil {
		t.Errorf("signing.pub: %v", err)
	}
	before, _ := os.ReadFile(filepath.Join(dir, "signing.key"))
	if _, _, err := noEnv(t, "keygen", "--out", dir); exitCode(err) != 1 {
		t.Errorf("keygen over an existing key: %v; want exit 1", err)
	}
	if after, _ := os.ReadFile(filepath.Join(dir, "signing.key")); !bytes.Equal(before, after) {
		t.Error("keygen replaced an existing key")
	}
}
