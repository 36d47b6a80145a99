package helm

import (
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// notValues are the names in the docs that start like a value and are not one: files and Go
// identifiers.
var notValues = map[string]bool{
	"signing.pub": true, "image.tar": true, "image.ref": true, // files
	"config.Tool": true, "config.Limits.ToolTimeout": true, // internal/config's Go names
}

var (
	fencedBlock = regexp.MustCompile("(?s)```.*?```")
	// dottedName is a `name.name…` in a doc's text.
	dottedName = regexp.MustCompile("`([a-zA-Z][a-zA-Z0-9_]*(?:\\.[a-zA-Z0-9_]+)+)")
)

// TestDocsNameOnlyChartValues: every chart value the docs name (a `a.b…` whose first name is one
// of values.yaml's) is a value of the chart, as values.schema.json spells them out (the worker
// config's keys under config included). A value renamed or removed without the docs fails here;
// the other way, every value is in the chart README's table (TestReadmeParameters).
func TestDocsNameOnlyChartValues(t *testing.T) {
	t.Parallel()
	raw, err := os.ReadFile(filepath.Join(chartDir, "values.schema.json"))
	if err != nil {
		t.Fatal(err)
	}
	var schema map[string]any
	if err := json.Unmarshal(raw, &schema); err != nil {
		t.Fatal(err)
	}
	top, _ := schema["properties"].(map[string]any)
	docs, err := filepath.Glob(filepath.Join("..", "..", "docs", "*.md"))
	if err != nil {
		t.Fatal(err)
	}
	docs = append(docs, filepath.Join("..", "..", "README.md"), filepath.Join(chartDir, readmeFile))
	checked := 0
	for _, doc := range docs {
		data, err := os.ReadFile(doc)
		if err != nil {
			t.Fatal(err)
		}
		// Fenced blocks hold other charts' --set values (the NATS chart's config.jetstream…).
		text := fencedBlock.ReplaceAllString(string(data), "")
		for _, m := range dottedName.FindAllStringSubmatch(text, -1) {
			name := m[1]
			first, _, _ := strings.Cut(name, ".")
			if top[first] == nil || notValues[name] {
				continue
			}
			checked++
			if !schemaHas(schema, name) {
				t.Errorf("%s names the chart value %s, which values.schema.json does not have", doc, name)
			}
		}
	}
	if checked < 50 {
		t.Errorf("checked %d value names in the docs: the docs were not read", checked)
	}
}

// schemaHas says whether the dotted path is a property of the schema, through maps
// (additionalProperties) and lists (items) as well.
func schemaHas(s map[string]any, path string) bool {
	for part := range strings.SplitSeq(path, ".") {
		if items, ok := s["items"].(map[string]any); ok {
			s = items
		}
		props, _ := s["properties"].(map[string]any)
		if sub, ok := props[part].(map[string]any); ok {
			s = sub
			continue
		}
		sub, ok := s["additionalProperties"].(map[string]any)
		if !ok {
			return false
		}
		s = sub
	}
	return true
}
