//go:build integration

package submitcmd

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/boxcar-run/boxcar/internal/job"
	"github.com/boxcar-run/boxcar/internal/provenance"
	"github.com/boxcar-run/boxcar/internal/store"
)

// TestPlantedFolderIsListedBounded: a writer of the store (versitygw) who puts thousands of
// objects under a committed run's folder, or an uncommitted one's, has verify and get list no
// more of it than the manifest names and provenance.MaxUnlisted more, saying there are more;
// the run itself still verifies and downloads. They listed the folder whole, each object a
// line: 3000 planted, 3000 lines of verify's and of get's (a folder with no manifest was
// listed whole too, to tell that it holds an object).
func TestPlantedFolderIsListedBounded(t *testing.T) {
	te, srv, bucket, args := newS3TestEnv(t)
	const planted = 3000
	plant := func(id string) {
		dir := filepath.Join(srv.Dir, bucket, filepath.FromSlash(store.TenantPrefix(job.DefaultTenant)+store.RunPrefix(id)), "planted")
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		for i := range planted {
			if err := os.WriteFile(filepath.Join(dir, fmt.Sprintf("%05d", i)), []byte("x"), 0o644); err != nil {
				t.Fatal(err)
			}
		}
	}
	committed := te.commitRun(t, true)
	plant(committed)
	uncommitted := job.NewID()
	plant(uncommitted)
	if err := te.st.Put(t.Context(), provenance.ManifestKey(uncommitted)+".old", strings.NewReader("x"), 1); err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		name  string
		args  []string
		code  int
		lines string // what each unlisted object's line holds
		want  string
	}{
		{"verify", []string{"verify", committed}, 0, "not named by the manifest", "and more objects the manifest does not name"},
		{"get", []string{"get", committed, "--out", filepath.Join(t.TempDir(), "run")}, 0, "not downloaded:", "and more objects the manifest does not name"},
		{"verify json", []string{"verify", committed, "--output", "json"}, 0, "planted/", `"unlisted_more":true`},
		{"get, no manifest", []string{"get", uncommitted, "--out", filepath.Join(t.TempDir(), "run")}, 1, "planted/", "an attempt's objects and no manifest"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			err := Run(t.Context(), append(tt.args, args...), te.getenv, &stdout, &stderr)
			out := stdout.String() + stderr.String() + message(err)
			if n := strings.Count(out, tt.lines); exitCode(err) != tt.code || n > provenance.MaxUnlisted+1 || !strings.Contains(out, tt.want) {
				t.Errorf("exit %d (%v), %d objects of the %d planted shown; want exit %d, at most %d shown and %q", exitCode(err), err, n, planted, tt.code, provenance.MaxUnlisted+1, tt.want)
			}
		})
	}
}
