package cli_test

import (
	"bytes"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/spf13/cobra"

	"github.com/boxcar-run/boxcar/internal/cli"
	"github.com/boxcar-run/boxcar/internal/submitcmd"
	"github.com/boxcar-run/boxcar/internal/workercmd"
)

var update = flag.Bool("update", false, "rewrite the generated parts of docs/cli.md")

// TestCLIDoc holds docs/cli.md's flag tables to the commands: each block between the markers
// is cli.FlagTables of the worker's or submit's command tree. `go test ./internal/cli -run
// TestCLIDoc -update` rewrites the blocks after a flag changed.
func TestCLIDoc(t *testing.T) {
	t.Parallel()
	path := filepath.Join("..", "..", "docs", "cli.md")
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	noEnv := func(string) string { return "" }
	doc := string(data)
	for _, root := range []*cobra.Command{
		workercmd.NewCommand(noEnv, &bytes.Buffer{}, &bytes.Buffer{}),
		submitcmd.NewCommand(noEnv, &bytes.Buffer{}, &bytes.Buffer{}),
	} {
		begin := fmt.Sprintf("<!-- flags of %s: generated from the commands; go test ./internal/cli -run TestCLIDoc -update rewrites them -->\n", root.Name())
		end := fmt.Sprintf("<!-- end of the flags of %s -->", root.Name())
		i, j := strings.Index(doc, begin), strings.Index(doc, end)
		if i < 0 || j < i {
			t.Fatalf("%s lacks the block of %s's flags: a line\n%s… then a line\n%s", path, root.Name(), begin, end)
		}
		doc = doc[:i+len(begin)] + "\n" + cli.FlagTables(root) + doc[j:]
	}
	if *update {
		if err := os.WriteFile(path, []byte(doc), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	if doc != string(data) {
		t.Errorf("the flag tables in %s differ from the commands; run go test ./internal/cli -run TestCLIDoc -update. They should read:\n%s", path, doc)
	}
}
