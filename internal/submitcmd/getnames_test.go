package submitcmd

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestGetArtifactNames: get downloads every artifact whatever name the job gave it within
// what the worker stores (a part of up to NAME_MAX bytes, a name of up to 512, any letters,
// the most files a run keeps), each to its own name and with its own bytes. A name part over
// 230 bytes failed the whole download (exit 1, "file name too long"): the file was written
// under a temporary name 25 bytes longer than its own, so a job could keep its run from being
// fetched, the manifest included.
func TestGetArtifactNames(t *testing.T) {
	te := newTestEnv(t)
	many := map[string][]byte{}
	for i := range 64 {
		many[fmt.Sprintf("part-%02d.csv", i)] = []byte(fmt.Sprintf("row %d\n", i))
	}
	tests := []struct {
		name      string
		artifacts map[string][]byte
	}{
		{"a part of NAME_MAX bytes", map[string][]byte{strings.Repeat("a", 255): []byte("long\n")}},
		{"a part just past the temporary name's room", map[string][]byte{strings.Repeat("b", 231) + ".csv": []byte("b\n")}},
		{"long parts in a folder", map[string][]byte{strings.Repeat("d", 200) + "/" + strings.Repeat("e", 255): []byte("deep\n")}},
		{"letters of other scripts", map[string][]byte{"résumé.csv": []byte("nfc\n"), "resume.csv": []byte("ascii\n"), "данные.txt": []byte("ru\n")}},
		{"the most files a run keeps", many},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			id := te.commitRunOf(t, true, tt.artifacts)
			out := t.TempDir()
			_, stderr, err := te.submit(t, "get", id, "--out", out)
			if err != nil {
				t.Fatalf("get: exit %d: %v\n%s", exitCode(err), err, stderr)
			}
			for name, want := range tt.artifacts {
				got, err := os.ReadFile(filepath.Join(out, "artifacts", name))
				if err != nil || string(got) != string(want) {
					t.Errorf("artifacts/%.40s… = %q, %v; want %q", name, got, err, want)
				}
			}
			for _, name := range []string{"report.md", "manifest.json", "manifest.dsse.json"} {
				if _, err := os.Stat(filepath.Join(out, name)); err != nil {
					t.Errorf("get did not download %s: %v", name, err)
				}
			}
		})
	}
}

// TestGetRefusesNamesThatAreOneFile: two names of a run that a file system ignoring case,
// Unicode normalization (NFC or NFD) or, on Windows, trailing dots and spaces holds as one
// file, or as a file where the other needs a folder, are refused before get writes anything
// (exit 1, both named), on every machine alike: written on macOS or Windows the second
// replaced the first without a word, and on Linux get wrote both, so this test, on a file
// system that tells them apart, saw every row downloaded on main.
func TestGetRefusesNamesThatAreOneFile(t *testing.T) {
	te := newTestEnv(t)
	tests := []struct {
		name       string
		first      string // the name taken, by byte order
		second     string
		firstData  string
		secondData string
	}{
		{"case", "Data.csv", "data.csv", "upper\n", "lower\n"},
		{"case beyond ASCII", "ΣΥΝΟΨΗ.txt", "συνοψη.txt", "upper\n", "lower\n"},
		{"NFC and NFD", "re\u0301sume\u0301.csv", "résumé.csv", "nfd\n", "nfc\n"},
		{"a file where a folder is", "Out/table.csv", "out", "in a folder\n", "a file\n"},
		{"trailing dot", "notes", "notes.", "plain\n", "dotted\n"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			id := te.commitRunOf(t, true, map[string][]byte{tt.first: []byte(tt.firstData), tt.second: []byte(tt.secondData)})
			out := filepath.Join(t.TempDir(), "run")
			_, stderr, err := te.submit(t, "get", id, "--out", out)
			if exitCode(err) != 1 || !strings.Contains(message(err), "artifacts/"+tt.first) || !strings.Contains(message(err), "artifacts/"+tt.second) {
				t.Errorf("get: exit %d (%v); want 1 naming artifacts/%s and artifacts/%s\n%s", exitCode(err), err, tt.first, tt.second, stderr)
			}
			if entries, err := os.ReadDir(out); !os.IsNotExist(err) {
				t.Errorf("get wrote %d entries into --out (%v); want nothing written", len(entries), err)
			}
		})
	}
}

// TestGetWritesIntoANewFolderOnly: get downloads into a folder that is not there or is empty,
// and refuses one that holds anything before it writes (exit 1, nothing written): a
// run's names are the job's choice (artifacts/…), and into --out . of a project, or an earlier
// download, get wrote the run's files over the user's without a word (on main 3 of the rows
// had a file of the user's replaced, a link by the run's report among them, and every refused
// row exited 0). Each file is also created only where nothing is (writeNew), so a name the
// refusal could not foresee fails the download rather than replace a file.
func TestGetWritesIntoANewFolderOnly(t *testing.T) {
	te := newTestEnv(t)
	id := te.commitRunOf(t, true, map[string][]byte{"build.sh": []byte("echo from the job\n")})
	outside := filepath.Join(t.TempDir(), "outside.md")
	if err := os.WriteFile(outside, []byte("the user's\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name  string
		setUp func(t *testing.T, dir string) // files of the user's in --out, before get
		mine  string                         // one of them, which must stay as it was; "" when get downloads
	}{
		{"a folder not there yet", func(t *testing.T, dir string) {}, ""},
		{"an empty folder", func(t *testing.T, dir string) { mkdir(t, dir) }, ""},
		{"the user's report", func(t *testing.T, dir string) {
			mkdir(t, dir)
			writeTestFile(t, dir, "report.md", "the user's\n")
		}, "report.md"},
		{"a project's artifacts folder", func(t *testing.T, dir string) {
			mkdir(t, filepath.Join(dir, "artifacts"))
			writeTestFile(t, filepath.Join(dir, "artifacts"), "build.sh", "the user's\n")
		}, filepath.Join("artifacts", "build.sh")},
		{"a link to a file outside", func(t *testing.T, dir string) {
			mkdir(t, dir)
			if err := os.Symlink(outside, filepath.Join(dir, "report.md")); err != nil {
				t.Fatal(err)
			}
		}, "report.md"},
		{"a hidden file", func(t *testing.T, dir string) {
			mkdir(t, dir)
			writeTestFile(t, dir, ".envrc", "the user's\n")
		}, ".envrc"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			out := filepath.Join(t.TempDir(), "run")
			tt.setUp(t, out)
			_, stderr, err := te.submit(t, "get", id, "--out", out)
			if tt.mine == "" {
				if data, rerr := os.ReadFile(filepath.Join(out, "artifacts", "build.sh")); err != nil || string(data) != "echo from the job\n" {
					t.Fatalf("get into %s: %v, build.sh %q (%v)\n%s", tt.name, err, data, rerr, stderr)
				}
				return
			}
			if exitCode(err) != 1 || !strings.Contains(message(err), "already holds") {
				t.Errorf("get: exit %d (%v); want 1, --out already holding files\n%s", exitCode(err), err, stderr)
			}
			if data, err := os.ReadFile(filepath.Join(out, tt.mine)); err != nil || string(data) != "the user's\n" {
				t.Errorf("%s = %q, %v; want the user's, as it was", tt.mine, data, err)
			}
			if _, err := os.Stat(filepath.Join(out, "manifest.json")); !os.IsNotExist(err) {
				t.Errorf("get wrote manifest.json: %v; want nothing written", err)
			}
			if data, err := os.ReadFile(outside); err != nil || string(data) != "the user's\n" {
				t.Errorf("the file outside --out = %q, %v; want it as it was", data, err)
			}
		})
	}
}

func mkdir(t *testing.T, dir string) {
	t.Helper()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
}
