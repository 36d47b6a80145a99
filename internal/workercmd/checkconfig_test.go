package workercmd

import (
	"bytes"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/boxcar-run/boxcar/internal/cli"
)

var update = flag.Bool("update", false, "rewrite the golden files of the tests that have one")

// TestCheckConfigGolden runs `worker check-config` on each config in testdata/check-config (ten
// broken, one valid) and compares what it prints, every problem with its file:line:col and key
// path, and the exit code, with testdata/check-config.golden. `go test -run
// TestCheckConfigGolden -update` rewrites the golden file after a deliberate change.
func TestCheckConfigGolden(t *testing.T) {
	files, err := filepath.Glob(filepath.Join("testdata", "check-config", "*.yaml"))
	if err != nil || len(files) < 11 {
		t.Fatalf("testdata/check-config: %d files, %v", len(files), err)
	}
	var got bytes.Buffer
	for _, f := range files {
		var out bytes.Buffer
		err := Run(t.Context(), []string{"check-config", f}, noEnv, &out, &out)
		code, msg := cli.ExitCode(err)
		fmt.Fprintf(&got, "== worker check-config %s: exit %d\n%s", filepath.ToSlash(f), code, out.String())
		cli.PrintError(&got, "worker", msg)
	}
	golden := filepath.Join("testdata", "check-config.golden")
	if *update {
		if err := os.WriteFile(golden, got.Bytes(), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(golden)
	if err != nil {
		t.Fatalf("%v (run with -update to write it)", err)
	}
	if !bytes.Equal(got.Bytes(), want) {
		t.Errorf("worker check-config output differs from %s (run with -update after a deliberate change):\n%s", golden, got.String())
	}
}
