package job

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// declaredStates are the State constants of status.go, read from its source so that a state
// added there is one this test knows of.
func declaredStates(t *testing.T) []State {
	t.Helper()
	f, err := parser.ParseFile(token.NewFileSet(), "status.go", nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	var states []State
	ast.Inspect(f, func(n ast.Node) bool {
		v, ok := n.(*ast.ValueSpec)
		if !ok {
			return true
		}
		if typ, ok := v.Type.(*ast.Ident); !ok || typ.Name != "State" {
			return true
		}
		for _, val := range v.Values {
			lit, ok := val.(*ast.BasicLit)
			if !ok {
				t.Fatalf("status.go: a State that is not a string literal: %T", val)
			}
			s, err := strconv.Unquote(lit.Value)
			if err != nil {
				t.Fatal(err)
			}
			states = append(states, State(s))
		}
		return true
	})
	return states
}

func readDoc(t *testing.T, name string) string {
	t.Helper()
	data, err := os.ReadFile(filepath.Join("..", "..", "docs", name))
	if err != nil {
		t.Fatal(err)
	}
	return string(data)
}

// TestDocsListEveryState holds docs/lifecycle.md's table of job states to the states a job can
// be in, and docs/operations.md's outcomes of boxcar_jobs_total to the terminal ones, both ways.
func TestDocsListEveryState(t *testing.T) {
	t.Parallel()
	states := declaredStates(t)
	var all, terminal []string
	for _, s := range states {
		all = append(all, string(s))
		if s.Terminal() {
			terminal = append(terminal, string(s))
		}
	}
	var table []string
	for _, m := range regexp.MustCompile("(?m)^\\| `([a-z_]+)` \\|").FindAllStringSubmatch(readDoc(t, "lifecycle.md"), -1) {
		table = append(table, m[1])
	}
	row := regexp.MustCompile("(?m)^\\| `boxcar_jobs_total` \\|.*$").FindString(readDoc(t, "operations.md"))
	_, outcomes, _ := strings.Cut(row, "final state (")
	var listed []string
	for _, m := range regexp.MustCompile("`([a-z_]+)`").FindAllStringSubmatch(outcomes, -1) {
		listed = append(listed, m[1])
	}
	for _, c := range []struct {
		where     string
		doc, code []string
	}{
		{"docs/lifecycle.md's table of states", table, all},
		{"docs/operations.md's outcomes of boxcar_jobs_total", listed, terminal},
	} {
		slices.Sort(c.doc)
		slices.Sort(c.code)
		if !slices.Equal(c.doc, c.code) {
			t.Errorf("%s: %v; the job's states: %v", c.where, c.doc, c.code)
		}
	}
	if len(states) < 10 {
		t.Errorf("read %d states from status.go", len(states))
	}
}
