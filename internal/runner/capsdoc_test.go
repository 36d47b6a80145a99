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

// capLists are the places in docs/ that list every cap: the text between after and before
// (what is in parentheses in it explains a cap: "the tenant's `daily_tokens`").
var capLists = []struct{ file, after, before string }{
	{"operations.md", "| `boxcar_cap_hits_total` | counter | profile, cap | jobs ended by ", " |"},
	{"cli.md", "for `capped` the cap that ended the job (", "):"},
}

// TestDocsNameEveryCap holds each list of the caps in docs/ (capLists) to capSentences, the
// caps a job can end capped with, both ways; and every cap the agent ends a run with (its Cap
// constants) to a row of capSentences, so that a new cap is both explained in report.md and
// documented where a team reads the metric and the CLI's output.
func TestDocsNameEveryCap(t *testing.T) {
	t.Parallel()
	var code []string
	for c := range capSentences {
		code = append(code, c)
	}
	slices.Sort(code)
	for _, l := range capLists {
		data, err := os.ReadFile(filepath.Join("..", "..", "docs", l.file))
		if err != nil {
			t.Fatal(err)
		}
		text := strings.Join(strings.Fields(string(data)), " ")
		_, list, ok := strings.Cut(text, l.after)
		list, _, ok2 := strings.Cut(list, l.before)
		if !ok || !ok2 {
			t.Errorf("docs/%s lacks its list of the caps, after %q", l.file, l.after)
			continue
		}
		list = regexp.MustCompile(`\([^)]*\)`).ReplaceAllString(list, "")
		var doc []string
		for _, m := range regexp.MustCompile("`([a-z_]+)`").FindAllStringSubmatch(list, -1) {
			doc = append(doc, m[1])
		}
		slices.Sort(doc)
		if !slices.Equal(doc, code) {
			t.Errorf("docs/%s lists the caps\n%v\na job can end capped with (capSentences)\n%v", l.file, doc, code)
		}
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
