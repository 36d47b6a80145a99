//go:build integration

package e2e

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/boxcar-run/boxcar/internal/provenance"
	"github.com/boxcar-run/boxcar/internal/provenance/interop"
	"github.com/boxcar-run/boxcar/internal/submitcmd"
	"github.com/boxcar-run/boxcar/internal/workercmd"
	"github.com/boxcar-run/boxcar/test/harness"
	"github.com/boxcar-run/boxcar/test/testworker"
)

// artifactProfile is the profile of testdata/provenance.yaml.
const artifactProfile = "artifact-writer"

// Files the scripted artifact model leaves, relative to the run's folder.
var (
	artifactTable   = "artifacts/table.csv"
	artifactSummary = "artifacts/notes/summary.txt"
	artifactFiles   = map[string]string{
		artifactTable:   "region,units\nnorth,40\nsouth,52\n",
		artifactSummary: "92 units in total.\n",
	}
	artifactReport = "# Units by region\n\nnorth 40, south 52: 92 units.\n"
	// artifactLinks are the symbolic links the model plants in the artifact folder: none of
	// them may be followed or uploaded.
	artifactLinks = [][2]string{
		{"/etc/passwd", "artifacts/passwd"},
		{"/etc", "artifacts/etc"},
		{"../sales.csv", "artifacts/input-link.csv"},
	}
)

// artifactModel is a scripted OpenAI-compatible endpoint for the artifact-writer profile: it
// writes two artifacts, plants symbolic links, writes the report and answers. The step is the
// number of assistant messages in the request, so it keeps no state across requests apart from
// what the test inspects: the Authorization headers and the tool results it was sent.
type artifactModel struct {
	url string

	mu      sync.Mutex
	auth    []string
	results []string
}

func newArtifactModel(t *testing.T) *artifactModel {
	t.Helper()
	m := &artifactModel{}
	srv := httptest.NewServer(http.HandlerFunc(m.serve))
	t.Cleanup(srv.Close)
	m.url = srv.URL + "/v1"
	return m
}

type scriptCall struct {
	tool string
	args map[string]string
}

func (m *artifactModel) script() []scriptCall {
	calls := []scriptCall{
		{"write_file", map[string]string{"path": artifactTable, "content": artifactFiles[artifactTable]}},
		{"write_file", map[string]string{"path": artifactSummary, "content": artifactFiles[artifactSummary]}},
	}
	for _, l := range artifactLinks {
		calls = append(calls, scriptCall{"link", map[string]string{"target": l[0], "name": l[1]}})
	}
	return append(calls, scriptCall{"write_file", map[string]string{"path": "report.md", "content": artifactReport}})
}

func (m *artifactModel) serve(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost || !strings.HasSuffix(r.URL.Path, "/chat/completions") {
		http.NotFound(w, r)
		return
	}
	var req struct {
		Model    string `json:"model"`
		Messages []struct {
			Role    string          `json:"role"`
			Content json.RawMessage `json:"content"`
		} `json:"messages"`
	}
	if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	step := 0
	var lastResult string
	for _, msg := range req.Messages {
		switch msg.Role {
		case "assistant":
			step++
		case "tool":
			lastResult = string(msg.Content)
			var text string
			if json.Unmarshal(msg.Content, &text) == nil {
				lastResult = text
			}
		}
	}
	m.mu.Lock()
	m.auth = append(m.auth, r.Header.Get("Authorization"))
	if lastResult != "" {
		m.results = append(m.results, lastResult)
	}
	m.mu.Unlock()

	answer := harness.Completion{ID: fmt.Sprintf("chatcmpl-artifacts-%d", step+1), Model: req.Model, Text: "Report and artifacts written.", Prompt: 10, Complete: 5}
	if script := m.script(); step < len(script) {
		answer.Calls = []harness.ToolCall{{ID: fmt.Sprintf("call_%d", step+1), Name: script[step].tool, Args: script[step].args}}
	}
	answer.Write(w)
}

func (m *artifactModel) seen() (auth, results []string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return slices.Clone(m.auth), slices.Clone(m.results)
}

// salesInput is the input of the artifact job, named sales.csv.
const salesInput = "region,units\nnorth,40\nsouth,52\n"

// runArtifactJob runs the artifact-writer job on w and returns its id once it succeeded.
func runArtifactJob(t *testing.T, w *worker, m *artifactModel) string {
	t.Helper()
	input := filepath.Join(t.TempDir(), "sales.csv")
	if err := os.WriteFile(input, []byte(salesInput), 0o644); err != nil {
		t.Fatal(err)
	}
	stdout, stderr, err := w.submit(t, "run", "--profile", artifactProfile, "--task", "Write the units report.",
		"--input", input, "--wait", "--output", "json")
	if err != nil {
		_, results := m.seen()
		t.Fatalf("submit run: %v\nstderr:\n%s\ntool results:\n%s", err, stderr, strings.Join(results, "\n"))
	}
	res := lastJSON(t, stdout)
	if res["state"] != "succeeded" {
		t.Fatalf("state = %v, want succeeded: %v", res["state"], res)
	}
	return res["id"].(string)
}

// storedManifest parses the manifest of run id in w's file store.
func storedManifest(t *testing.T, w *worker, id string) provenance.Statement {
	t.Helper()
	return manifestIn(t, filepath.Join(w.DataDir, "store"), id)
}

// manifestIn parses the manifest of run id in the file store at storeDir.
func manifestIn(t *testing.T, storeDir, id string) provenance.Statement {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(storeDir, "tenants", "default", "runs", id, "manifest.json"))
	if err != nil {
		t.Fatal(err)
	}
	stmt, err := provenance.Parse(data)
	if err != nil {
		t.Fatal(err)
	}
	return stmt
}

// committedFolder is where the file store at storeDir keeps the files of run id's committed
// attempt, as its manifest names them (runs/<id>/attempts/<n>-<random>/), the way get and
// verify find them.
func committedFolder(t *testing.T, storeDir, id string) string {
	t.Helper()
	for _, s := range manifestIn(t, storeDir, id).Subjects {
		if s.Name == "transcript.jsonl" {
			key := strings.TrimSuffix(provenance.SubjectKey(id, s), s.Name)
			return filepath.Join(storeDir, "tenants", "default", filepath.FromSlash(key))
		}
	}
	t.Fatalf("the manifest of %s names no transcript", id)
	return ""
}

func subjectNames(stmt provenance.Statement) []string {
	var names []string
	for _, s := range stmt.Subjects {
		names = append(names, s.Name)
	}
	return names
}

// failLine matches the verdict line of a failed check of file.
func failLine(file string) *regexp.Regexp {
	return regexp.MustCompile(`(?m)^\s+FAIL\s+` + regexp.QuoteMeta(file) + `\s`)
}

// tamper changes a file of the store for one subtest and puts it back when the subtest ends.
func tamper(t *testing.T, path string, change func(data []byte) ([]byte, bool)) {
	t.Helper()
	orig, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := os.WriteFile(path, orig, fi.Mode().Perm()); err != nil {
			t.Errorf("restore %s: %v", path, err)
		}
	})
	data, keep := change(bytes.Clone(orig))
	if !keep {
		if err := os.Remove(path); err != nil {
			t.Fatal(err)
		}
		return
	}
	if bytes.Equal(data, orig) {
		t.Fatalf("tampering left %s unchanged", path)
	}
	if err := os.WriteFile(path, data, fi.Mode().Perm()); err != nil {
		t.Fatal(err)
	}
}

func sha256Hex(data []byte) string {
	sum := sha256.Sum256(data)
	return hex.EncodeToString(sum[:])
}

// TestVerifyRun runs a job that leaves a report, two artifacts and links in its artifact folder
// on an embedded worker, which signs its manifest with the key it created in its data dir; then
// checks the run with submit verify and submit get, untouched and after each kind of tampering.
func TestVerifyRun(t *testing.T) {
	t.Parallel()
	m := newArtifactModel(t)
	w := startWorker(t, m.url, "--config", "testdata/provenance.yaml")
	id := runArtifactJob(t, w, m)
	storeDir := filepath.Join(w.DataDir, "store")
	run := filepath.Join(storeDir, "tenants", "default", "runs", id)
	files := committedFolder(t, storeDir, id)

	t.Run("signed by default", func(t *testing.T) {
		key := filepath.Join(w.DataDir, "keys", "signing.key")
		fi, err := os.Stat(key)
		if err != nil {
			t.Fatalf("the embedded worker made no key: %v", err)
		}
		if fi.Mode().Perm() != 0o600 {
			t.Errorf("%s has mode %04o, want 0600", key, fi.Mode().Perm())
		}
		if _, err := provenance.ReadPublicKeyFile(filepath.Join(w.DataDir, "keys", "signing.pub")); err != nil {
			t.Error(err)
		}
		if _, err := os.Stat(filepath.Join(run, "manifest.dsse.json")); err != nil {
			t.Errorf("no signature beside the manifest: %v", err)
		}
	})

	t.Run("artifacts listed, links not followed", func(t *testing.T) {
		stmt := storedManifest(t, w, id)
		want := []string{artifactSummary, artifactTable, "report.md", "transcript.jsonl"}
		if got := subjectNames(stmt); !slices.Equal(got, want) {
			t.Errorf("manifest subjects = %q, want %q", got, want)
		}
		for name, content := range artifactFiles {
			if got, err := os.ReadFile(filepath.Join(files, name)); err != nil || string(got) != content {
				t.Errorf("stored %s = %q, %v; want %q", name, got, err, content)
			}
		}
		var stored []string
		_ = filepath.WalkDir(filepath.Join(files, "artifacts"), func(p string, d fs.DirEntry, err error) error {
			if err == nil && !d.IsDir() {
				rel, _ := filepath.Rel(files, p)
				stored = append(stored, filepath.ToSlash(rel))
			}
			return nil
		})
		if want := []string{artifactSummary, artifactTable}; !slices.Equal(stored, want) {
			t.Errorf("store holds artifacts %q, want the regular files %q only", stored, want)
		}
		_, results := m.seen()
		if links := strings.Count(strings.Join(results, "\n"), `"exit_code":0`); links < len(artifactLinks) {
			t.Errorf("only %d tool calls exited 0; the links were not all made:\n%s", links, strings.Join(results, "\n"))
		}
	})

	t.Run("untouched run verifies", func(t *testing.T) {
		stdout, stderr, err := w.submit(t, "verify", id)
		if err != nil {
			t.Fatalf("verify: %v\n%s%s", err, stdout, stderr)
		}
		for _, file := range []string{"manifest.json", "manifest.dsse.json", "report.md", artifactTable, artifactSummary, "transcript.jsonl", "input sales.csv"} {
			if !regexp.MustCompile(`(?m)^\s+ok\s+` + regexp.QuoteMeta(file)).MatchString(stdout) {
				t.Errorf("verdict lacks an ok line for %s:\n%s", file, stdout)
			}
		}
		if !strings.Contains(stdout, "verified: every file matches the manifest, and the manifest is signed by key") {
			t.Errorf("verdict does not say the run is verified and signed:\n%s", stdout)
		}

		stdout, _, err = w.submit(t, "verify", id, "--output", "json")
		if err != nil {
			t.Fatalf("verify --output json: %v", err)
		}
		v := lastJSON(t, stdout)
		if v["verified"] != true || v["signature"] != "verified" || v["key_id"] == "" {
			t.Errorf("verify json = %v", v)
		}
	})

	// The stored envelope as it is, with other projects' verifiers and the public key file.
	t.Run("other verifiers accept the run", func(t *testing.T) {
		env, err := os.ReadFile(filepath.Join(run, "manifest.dsse.json"))
		if err != nil {
			t.Fatal(err)
		}
		manifest, err := os.ReadFile(filepath.Join(run, "manifest.json"))
		if err != nil {
			t.Fatal(err)
		}
		pubPath := filepath.Join(w.DataDir, "keys", "signing.pub")
		pubPEM, err := os.ReadFile(pubPath)
		if err != nil {
			t.Fatal(err)
		}
		for name, verify := range map[string]func(context.Context, []byte, []byte) ([]byte, error){
			"go-securesystemslib": interop.SSLib,
			"in-toto-golang":      interop.InToto,
		} {
			if payload, err := verify(t.Context(), env, pubPEM); err != nil || !bytes.Equal(payload, manifest) {
				t.Errorf("%s: %v; or its payload is not the stored manifest", name, err)
			}
		}
		pub, err := provenance.ReadPublicKeyFile(pubPath)
		if err != nil {
			t.Fatal(err)
		}
		bundle, err := provenance.Bundle(t.Context(), env, pub)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := interop.Sigstore(bundle, pub, sha256Hex([]byte(artifactReport))); err != nil {
			t.Errorf("sigstore-go rejects the run's bundle for report.md: %v", err)
		}
	})

	t.Run("get checks digests", func(t *testing.T) {
		out := t.TempDir()
		stdout, stderr, err := w.submit(t, "get", id, "--out", out)
		if err != nil {
			t.Fatalf("get: %v\n%s", err, stderr)
		}
		want := map[string]string{"report.md": artifactReport}
		for k, v := range artifactFiles {
			want[k] = v
		}
		for name, content := range want {
			if got, err := os.ReadFile(filepath.Join(out, name)); err != nil || string(got) != content {
				t.Errorf("downloaded %s = %q, %v; want %q", name, got, err, content)
			}
		}
		for _, name := range []string{"transcript.jsonl", "manifest.json", "manifest.dsse.json"} {
			if !strings.Contains(stdout, filepath.Join(out, name)) {
				t.Errorf("get did not download %s:\n%s", name, stdout)
			}
		}
	})

	inputObject := filepath.Join(storeDir, "tenants", "default", "inputs", "sha256", sha256Hex([]byte(salesInput)))
	replace := func(old, new string) func([]byte) ([]byte, bool) {
		return func(data []byte) ([]byte, bool) { return bytes.Replace(data, []byte(old), []byte(new), 1), true }
	}
	remove := func([]byte) ([]byte, bool) { return nil, false }
	tests := []struct {
		name string
		path string // in the store
		// change returns the new content, or false to remove the file.
		change func([]byte) ([]byte, bool)
		// wantFail is the file verify names in a FAIL line; getFails, when set, is the
		// file get refuses.
		wantFail string
		getFails string
	}{
		{name: "modified report", path: filepath.Join(files, "report.md"), change: replace("92 units", "93 units"),
			wantFail: "report.md", getFails: "report.md"},
		{name: "modified artifact", path: filepath.Join(files, artifactTable), change: replace("north,40", "north,41"),
			wantFail: artifactTable, getFails: artifactTable},
		{name: "removed artifact", path: filepath.Join(files, artifactSummary), change: remove,
			wantFail: artifactSummary, getFails: artifactSummary},
		{name: "modified manifest", path: filepath.Join(run, "manifest.json"), change: replace(`"state":"succeeded"`, `"state":"failed"`),
			wantFail: "manifest.dsse.json"},
		{name: "removed signature", path: filepath.Join(run, "manifest.dsse.json"), change: remove,
			wantFail: "manifest.dsse.json"},
		{name: "swapped input", path: inputObject, change: replace("north,40", "north,14"),
			wantFail: "input sales.csv"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tamper(t, tt.path, tt.change)
			stdout, stderr, err := w.submit(t, "verify", id)
			if code := exitCode(err); code != 8 {
				t.Fatalf("verify exit code = %d (%v), want 8\n%s%s", code, err, stdout, stderr)
			}
			if !failLine(tt.wantFail).MatchString(stdout) {
				t.Errorf("verdict has no FAIL line for %s:\n%s", tt.wantFail, stdout)
			}
			if !strings.Contains(err.Error(), tt.wantFail) || !strings.Contains(stdout, "NOT VERIFIED") {
				t.Errorf("verify error %q or verdict does not name %s:\n%s", err, tt.wantFail, stdout)
			}
			if tt.getFails == "" {
				return
			}
			out := t.TempDir()
			_, stderr, err = w.submit(t, "get", id, "--out", out)
			if code := exitCode(err); code != 8 || !strings.Contains(err.Error(), tt.getFails) {
				t.Fatalf("get: exit %d, %v; want 8 naming %s\n%s", code, err, tt.getFails, stderr)
			}
			if _, err := os.Stat(filepath.Join(out, tt.getFails)); err == nil {
				t.Errorf("get kept %s, which does not match the manifest", tt.getFails)
			}
			if _, err := os.Stat(filepath.Join(out, "transcript.jsonl")); err != nil {
				t.Errorf("get did not keep the files that match: %v", err)
			}
		})
	}

	// An attacker who edits the report and rewrites its digest in the manifest passes the
	// digest checks; only the signature catches it.
	t.Run("report and manifest rewritten together", func(t *testing.T) {
		stmt := storedManifest(t, w, id)
		var oldSum string
		for _, s := range stmt.Subjects {
			if s.Name == "report.md" {
				oldSum = s.SHA256
			}
		}
		forged := strings.Replace(artifactReport, "92 units", "99 units", 1)
		tamper(t, filepath.Join(files, "report.md"), replace(artifactReport, forged))
		tamper(t, filepath.Join(run, "manifest.json"), replace(oldSum, sha256Hex([]byte(forged))))
		stdout, _, err := w.submit(t, "verify", id)
		if code := exitCode(err); code != 8 || !failLine("manifest.dsse.json").MatchString(stdout) {
			t.Fatalf("verify: exit %d, %v; want 8 with the signature failing\n%s", code, err, stdout)
		}
		if !regexp.MustCompile(`(?m)^\s+ok\s+report\.md`).MatchString(stdout) {
			t.Errorf("the forged report should match the forged manifest's digest:\n%s", stdout)
		}
	})

	// Planted beside the committed files, in the committed attempt's own folder.
	t.Run("extra object is reported", func(t *testing.T) {
		extra := filepath.Join(files, "artifacts", "planted.sh")
		if err := os.WriteFile(extra, []byte("echo planted\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { os.Remove(extra) })
		rel, _ := filepath.Rel(run, extra)
		stdout, _, err := w.submit(t, "verify", id)
		if err != nil || !regexp.MustCompile(`(?m)^\s+note\s+`+regexp.QuoteMeta(rel)+`\s+not named by the manifest`).MatchString(stdout) {
			t.Errorf("verify: %v; want success with a note on the planted file:\n%s", err, stdout)
		}
		out := t.TempDir()
		_, stderr, err := w.submit(t, "get", id, "--out", out)
		if err != nil || !strings.Contains(stderr, "not downloaded: "+rel) {
			t.Errorf("get: %v; want success reporting the planted file:\n%s", err, stderr)
		}
		if _, err := os.Stat(filepath.Join(out, "artifacts", "planted.sh")); err == nil {
			t.Error("get downloaded a file the manifest does not name")
		}
	})

	t.Run("keys", func(t *testing.T) {
		other := t.TempDir()
		if _, _, err := w.submit(t, "keygen", "--out", other); err != nil {
			t.Fatalf("submit keygen: %v", err)
		}
		// Another key than the signer's.
		stdout, _, err := w.submit(t, "verify", id, "--public-key", filepath.Join(other, "signing.pub"))
		if code := exitCode(err); code != 8 || !failLine("manifest.dsse.json").MatchString(stdout) {
			t.Errorf("verify with another key: exit %d, %v; want 8 with the signature failing\n%s", code, err, stdout)
		}
		// The signer's key named explicitly.
		if stdout, _, err := w.submit(t, "verify", id, "--public-key", filepath.Join(w.DataDir, "keys", "signing.pub")); err != nil {
			t.Errorf("verify with the worker's key: %v\n%s", err, stdout)
		}
		// No key at all: verify fails closed; --allow-unsigned checks the digests and says the
		// signature was not checked.
		noKey := func(args ...string) (string, error) {
			return submitWith(t, map[string]string{"BOXCAR_HOME": t.TempDir(), "BOXCAR_STORE": "file://" + storeDir}, args...)
		}
		stdout, err = noKey("verify", id, "--allow-unsigned")
		if err != nil || !strings.Contains(stdout, "SIGNATURE WAS NOT CHECKED") || !regexp.MustCompile(`(?m)^\s+skip\s+manifest\.dsse\.json`).MatchString(stdout) {
			t.Errorf("verify --allow-unsigned without a key: %v; want success saying the signature was not checked\n%s", err, stdout)
		}
		stdout, err = noKey("verify", id)
		if code := exitCode(err); code != 8 || !failLine("manifest.dsse.json").MatchString(stdout) {
			t.Errorf("verify without a key: exit %d, %v; want 8 (fails closed)\n%s", code, err, stdout)
		}
	})
}

// submitWith runs the submit command with exactly env and returns its output and error.
func submitWith(t *testing.T, env map[string]string, args ...string) (string, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	var out bytes.Buffer
	err := submitcmd.Run(ctx, args, harness.Env(env).Getenv, &out, &out)
	return out.String(), err
}

// TestSigningKeyFlag runs a worker that signs with a key made by `worker keygen` and handed over
// with --signing-key, as a cluster hands over a mounted Secret: it makes no key of its own, and
// verify needs the public key named.
func TestSigningKeyFlag(t *testing.T) {
	t.Parallel()
	keys := t.TempDir()
	var out bytes.Buffer
	if err := workercmd.Run(t.Context(), []string{"keygen", "--out", keys}, harness.Env(nil).Getenv, &out, &out); err != nil {
		t.Fatalf("worker keygen: %v\n%s", err, out.String())
	}
	if err := workercmd.Run(t.Context(), []string{"keygen", "--out", keys}, harness.Env(nil).Getenv, &out, &out); err == nil || !strings.Contains(err.Error(), "remove it first") {
		t.Errorf("a second worker keygen into the same folder: %v; want a refusal", err)
	}

	m := newArtifactModel(t)
	w := startWorker(t, m.url, "--config", "testdata/provenance.yaml", "--signing-key", filepath.Join(keys, "signing.key"))
	id := runArtifactJob(t, w, m)
	if _, err := os.Stat(filepath.Join(w.DataDir, "keys", "signing.key")); err == nil {
		t.Error("the worker made a signing key of its own although --signing-key was given")
	}
	stdout, _, err := w.submit(t, "verify", id, "--public-key", filepath.Join(keys, "signing.pub"))
	if err != nil || !strings.Contains(stdout, "and the manifest is signed by key") {
		t.Errorf("verify with the keygen key: %v\n%s", err, stdout)
	}
	stdout, _, err = w.submit(t, "verify", id, "--allow-unsigned")
	if err != nil || !strings.Contains(stdout, "SIGNATURE WAS NOT CHECKED") {
		t.Errorf("verify --allow-unsigned without the key: %v; want digests verified and the signature not checked\n%s", err, stdout)
	}
	if _, _, err = w.submit(t, "verify", id); exitCode(err) != 8 {
		t.Errorf("verify without the key: %v; want exit 8 (fails closed)", err)
	}
}

// TestNoSecretInRunOutputs runs jobs with debug logging and scans everything the worker wrote
// (manifests, signatures, transcripts, reports, artifacts, the JetStream files, its log) for
// the API key, which the model must have received.
func TestNoSecretInRunOutputs(t *testing.T) {
	t.Parallel()
	m := newArtifactModel(t)
	w := startWorker(t, m.url, "--config", "testdata/provenance.yaml", "--log-level", "debug")
	id := runArtifactJob(t, w, m)

	auth, _ := m.seen()
	if len(auth) == 0 || auth[0] != "Bearer "+testworker.APIKey {
		t.Fatalf("the model did not receive the API key (Authorization %q); the scan would prove nothing", auth)
	}
	scanned := map[string]bool{}
	// NATS goes on writing its files during the walk: one renamed away (its .tmp) is skipped.
	err := filepath.WalkDir(w.DataDir, func(p string, d fs.DirEntry, err error) error {
		if errors.Is(err, fs.ErrNotExist) {
			return nil
		}
		if err != nil || d.IsDir() {
			return err
		}
		data, err := os.ReadFile(p)
		if errors.Is(err, fs.ErrNotExist) {
			return nil
		}
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(w.DataDir, p)
		scanned[filepath.Base(p)] = true
		if bytes.Contains(data, []byte(testworker.APIKey)) || bytes.Contains(data, []byte("sk-e2e-secret")) {
			t.Errorf("%s contains the API key", rel)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"manifest.json", "manifest.dsse.json", "transcript.jsonl", "report.md", "table.csv"} {
		if !scanned[name] {
			t.Errorf("the scan did not reach %s of run %s", name, id)
		}
	}
	if log := w.Log.String(); strings.Contains(log, "sk-e2e-secret") {
		t.Error("worker log contains the API key")
	} else if !strings.Contains(log, `"level":"DEBUG"`) && !strings.Contains(log, "manifests are signed") {
		t.Errorf("the worker log is empty; the scan would prove nothing:\n%s", log)
	}
}
