package runner

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

// TestDocsNameEveryCap holds the caps of docs/operations.md's boxcar_cap_hits_total row to
// capSentences, the caps a job can end capped with, both ways; and every cap the agent ends a
// run with (its Cap constants) to a row of capSentences, so that a new cap is both explained in
// report.md and documented where a team reads the metric.
func TestDocsNameEveryCap(t *testing.T) {
	t.Parallel()
	data, err := os.ReadFile(filepath.Join("..", "..", "docs", "operations.md"))
	if err != nil {
		t.Fatal(err)
	}
	var row string
	for line := range strings.Lines(string(data)) {
		if strings.HasPrefix(line, "| `boxcar_cap_hits_total` |") {
			row = line
		}
	}
	if row == "" {
		t.Fatal("docs/operations.md has no row for boxcar_cap_hits_total in its metrics table")
	}
	cells := strings.Split(row, "|")
	// The last cell names the caps; what is in parentheses explains one ("the tenant's `daily_tokens`").
	list := regexp.MustCompile(`\([^)]*\)`).ReplaceAllString(cells[len(cells)-2], "")
	var doc []string
	for _, m := range regexp.MustCompile("`([a-z_]+)`").FindAllStringSubmatch(list, -1) {
		doc = append(doc, m[1])
	}
	var code []string
	for c := range capSentences {
		code = append(code, c)
	}
	slices.Sort(doc)
	slices.Sort(code)
	if !slices.Equal(doc, code) {
		t.Errorf("docs/operations.md says boxcar_cap_hits_total counts the caps\n%v\na job can end capped with (capSentences)\n%v", doc, code)
	}
	for name, value := range agentCaps(t) {
		if _, ok := capSentences[value]; !ok {
			t.Errorf("agent.%s (%q) ends a run capped, but capSentences has no row for it", name, value)
		}
	}
}

// agentCaps are the agent package's Cap constants, read from its source: name → value.
func agentCaps(t *testing.T) map[string]string {
	t.Helper()
	files, err := filepath.Glob(filepath.Join("..", "agent", "*.go"))
	if err != nil {
		t.Fatal(err)
	}
	caps := map[string]string{}
	fset := token.NewFileSet()
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		file, err := parser.ParseFile(fset, f, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		ast.Inspect(file, func(n ast.Node) bool {
			spec, ok := n.(*ast.ValueSpec)
			if !ok {
				return true
			}
			for i, id := range spec.Names {
				if !strings.HasPrefix(id.Name, "Cap") || i >= len(spec.Values) {
					continue
				}
				if lit, ok := spec.Values[i].(*ast.BasicLit); ok && lit.Kind == token.STRING {
					caps[id.Name], _ = strconv.Unquote(lit.Value)
				}
			}
			return true
		})
	}
	if len(caps) < 6 {
		t.Fatalf("found %d Cap constants in internal/agent (%v), want its six at least", len(caps), caps)
	}
	return caps
}
