package submitcmd

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// cancelOnWrite is a stdout that ends the command's context at its first write: get prints
// each file as it keeps it, so the download is interrupted right after its first file.
type cancelOnWrite struct{ cancel context.CancelFunc }

func (w cancelOnWrite) Write(p []byte) (int, error) {
	w.cancel()
	return len(p), nil
}

// TestGetInterruptedLeavesNothing: a download that does not finish (Ctrl-C after its first
// file) removes what it wrote, leaving --out as it found it, not there or empty, so the same
// get run again downloads the run whole. It left the files kept so far and no manifest: a
// folder that looked like a download, and that the next get refused as holding files (on
// main: artifacts/a.csv left, the second get exit 1, "already holds artifacts").
func TestGetInterruptedLeavesNothing(t *testing.T) {
	te := newTestEnv(t)
	id := te.commitRunOf(t, true, map[string][]byte{"a.csv": []byte("a,b\n")})
	for _, tt := range []struct {
		name  string
		empty bool // --out is an empty folder; else it is not there
	}{{"new folder", false}, {"empty folder", true}} {
		t.Run(tt.name, func(t *testing.T) {
			out := filepath.Join(t.TempDir(), "run")
			if tt.empty {
				if err := os.Mkdir(out, 0o755); err != nil {
					t.Fatal(err)
				}
			}
			args := []string{"get", id, "--out", out, "--store", "file://" + te.storeDir}
			ctx, cancel := context.WithCancel(t.Context())
			defer cancel()
			stdout := cancelOnWrite{cancel: cancel}
			var stderr bytes.Buffer
			err := Run(ctx, args, te.getenv, stdout, &stderr)
			left, rerr := os.ReadDir(out)
			if exitCode(err) != exitInterrupted || len(left) > 0 || tt.empty == os.IsNotExist(rerr) {
				t.Errorf("interrupted get: exit %d (%v), --out holds %d entries (%v); want %d and --out as it was", exitCode(err), err, len(left), rerr, exitInterrupted)
			}
			if !strings.Contains(message(err), "nothing kept") {
				t.Errorf("interrupted get says %q; want it to say nothing was kept", message(err))
			}
			stderr.Reset()
			if err := Run(t.Context(), args, te.getenv, &bytes.Buffer{}, &stderr); err != nil {
				t.Errorf("get again into %s: %v\n%s", out, err, stderr.String())
			}
		})
	}
}
