package provenance_test

import (
	"bytes"
	"flag"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/boxcar-run/boxcar/internal/config"
	"github.com/boxcar-run/boxcar/internal/provenance"
)

var update = flag.Bool("update", false, "rewrite the manifests of testdata/build")

// TestBuildBytes: Build writes the same bytes for the same run from one version to the next
// (a verifier that rebuilds a manifest must get what was signed), for a run of the example
// profile and for one whose profile and task hold what the canonical form rewrites: HTML
// characters, U+2028, names beyond ASCII, floats and an integer beyond 2^53; with its profile
// as Build encodes it and as ProfileOf did ahead.
func TestBuildBytes(t *testing.T) {
	fixed := provenance.Worker{ID: "worker-1", Version: "v1.2.0", VCSRevision: "0123456789abcdef0123", GoVersion: "go1.26.8"}
	example := sampleManifest(t)
	example.Worker = fixed

	odd := sampleManifest(t)
	odd.Worker = fixed
	odd.Job.Task = "Line\u2028separator, tab\t, \"quoted\" \\ <b>&</b> caf\u00e9 \U0001F600"
	odd.Job.Labels = map[string]string{"\uff61": "halfwidth", "\U0001F600": "emoji"}
	spec := exampleProfile(t)
	spec.SystemPrompt = "Never <script>&</script>; para\u2029graph, caf\u00e9 \U0001F600\n"
	spec.Tools = append(spec.Tools, config.Tool{Name: "odd", Kind: config.ToolCommand, Command: []string{"true", "{{n}}"},
		Parameters: map[string]any{"type": "object", "\u00e9": 1.5, "big": int64(1<<62 + 1), "tiny": 1e-7, "huge": 1e21,
			"properties": map[string]any{"n": map[string]any{"type": "number", "minimum": 0, "maximum": 100}}}})
	spec.Limits.CommandTimeout = config.Duration(1500 * time.Millisecond)
	odd.Profile.Spec = spec

	for name, m := range map[string]provenance.Manifest{"example": example, "odd": odd} {
		t.Run(name, func(t *testing.T) {
			got := build(t, m, sampleSubjects())
			path := filepath.Join("testdata", "build", name+".json")
			if *update {
				if err := os.WriteFile(path, got, 0o644); err != nil {
					t.Fatal(err)
				}
			}
			want, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			sameBytes(t, "Build", got, want, path)
			// A worker's profile is encoded once (ProfileOf), and its manifests are the same.
			if m.Profile, err = provenance.ProfileOf(m.Profile.Name, m.Profile.Spec); err != nil {
				t.Fatal(err)
			}
			sameBytes(t, "Build with ProfileOf", build(t, m, sampleSubjects()), want, path)
		})
	}
}

func sameBytes(t *testing.T, what string, got, want []byte, path string) {
	t.Helper()
	if !bytes.Equal(got, want) {
		i := 0
		for i < len(got) && i < len(want) && got[i] == want[i] {
			i++
		}
		t.Errorf("%s wrote other bytes than %s; first difference at byte %d:\n got …%.80s\nwant …%.80s", what, path, i, got[max(i-20, 0):], want[max(i-20, 0):])
	}
}
