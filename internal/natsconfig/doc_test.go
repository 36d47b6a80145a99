package natsconfig_test

import (
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/boxcar-run/boxcar/internal/config"
	"github.com/boxcar-run/boxcar/internal/natsconfig"
)

var update = flag.Bool("update", false, "rewrite the generated permission table of docs/security.md")

const (
	docBegin = "<!-- permissions: generated from natsconfig.Table; go test ./internal/natsconfig -run TestSecurityDoc -update rewrites them -->\n"
	docEnd   = "<!-- end of the permissions -->"
)

// TestSecurityDoc holds docs/security.md's permission table to natsconfig.Table, which is what
// `worker nats-config` writes into every identity's JWT.
func TestSecurityDoc(t *testing.T) {
	t.Parallel()
	path := filepath.Join("..", "..", "docs", "security.md")
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	doc := string(data)
	i, j := strings.Index(doc, docBegin), strings.Index(doc, docEnd)
	if i < 0 || j < i {
		t.Fatalf("%s lacks the permission table's block: a line\n%s… then a line\n%s", path, docBegin, docEnd)
	}
	names := natsconfig.NamesOf(config.Config{}.WithDefaults().NATS)
	want := doc[:i+len(docBegin)] + "\n" + natsconfig.DocTable(names) + "\n" + doc[j:]
	if *update {
		if err := os.WriteFile(path, []byte(want), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	if want != doc {
		t.Errorf("the permission table in %s differs from natsconfig.Table; run go test ./internal/natsconfig -run TestSecurityDoc -update. It should read:\n%s", path, natsconfig.DocTable(names))
	}
}
