package runner

import (
	"fmt"
	"strings"
	"testing"

	"github.com/boxcar-run/boxcar/internal/provenance"
)

// Audit (session 22, area "contain"). Run with
//
//	go test -count=1 -run 'TestAuditContain' ./internal/runner

// TestAuditContainCountCapSkipNamesUnchecked: collectArtifacts names each file it leaves out
// in the manifest's collected.skipped, at most 64 of them, and a name is cut to maxNamedPath
// (256 bytes) so that "a job can make any number of them" costs the manifest little: bad_name
// names go through sandbox.ShortPath, and so do the sandbox's IncompleteError paths. But the
// count cap is checked before the name, and names each file past the 64th by its path as the
// job made it: 64 paths of up to PATH_MAX (4 KiB) each go into the signed manifest, 16 times
// the bound (and one whole into the worker's log line, first_left_out).
func TestAuditContainCountCapSkipNamesUnchecked(t *testing.T) {
	t.Parallel()
	files := map[string]int64{}
	for i := range maxArtifacts {
		files[fmt.Sprintf("artifacts/f%03d.txt", i)] = 1
	}
	hostile := "artifacts/z" + strings.Repeat("y", 4000)
	files[hostile] = 1
	a := testAttempt("artifacts")
	var c provenance.Collected
	if _, err := (&Runner{}).collectArtifacts(t.Context(), a, &memSandbox{files: files}, &c); err != nil {
		t.Fatal(err)
	}
	for _, s := range c.Skipped {
		if len(s.Path) > maxNamedPath+len("…") {
			t.Errorf("the manifest names a left-out file (%s) by a path of %d bytes (%q...); want it cut to %d bytes, as bad_name names are",
				s.Reason, len(s.Path), s.Path[:min(len(s.Path), 60)], maxNamedPath)
		}
	}
}
