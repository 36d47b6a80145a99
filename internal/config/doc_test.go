package config

import (
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"go.yaml.in/yaml/v3"
)

// docPath is the reference a platform team writes its worker config from.
var docPath = filepath.Join("..", "..", "docs", "configuration.md")

// docExamples are the keys whose value in the reference block is an example, not the worker's
// default, and why; every other value the block shows must be the default.
var docExamples = map[string]string{
	"store.url":                            "an example; the default depends on --embedded",
	"sandbox.kubernetes.image_pull_policy": "empty is IfNotPresent, applied by the sandbox backend",
	"profiles.*.model.name":                "required, no default",
	"profiles.*.system_prompt":             "an example",
	"egress.limits.max_requests":           "zero takes the proxy's default; internal/egress's TestConfigurationDocShowsTheProxyDefaults holds the block to those",
	"egress.limits.max_bytes":              "zero takes the proxy's default",
	"egress.limits.max_tunnels":            "zero takes the proxy's default",
	"egress.limits.max_header_bytes":       "zero takes the proxy's default",
	"egress.limits.header_timeout":         "zero takes the proxy's default",
	"egress.limits.dial_timeout":           "zero takes the proxy's default",
	"egress.limits.idle_timeout":           "zero takes the proxy's default",
}

// docBlock is the first ```yaml block of docs/configuration.md, the reference of every key, and
// the number of the file's lines before it (a node's Line plus it is the file's line).
func docBlock(t *testing.T) ([]byte, int) {
	t.Helper()
	data, err := os.ReadFile(docPath)
	if err != nil {
		t.Fatal(err)
	}
	before, rest, ok := strings.Cut(string(data), "```yaml\n")
	block, _, ok2 := strings.Cut(rest, "```\n")
	if !ok || !ok2 {
		t.Fatalf("%s has no ```yaml block", docPath)
	}
	return []byte(block), strings.Count(before, "\n") + 1
}

// docValue is one key the reference block sets: its path in the block ("profiles.NAME.model"),
// its value's node, its line in docs/configuration.md and that line's text with its comment.
type docValue struct {
	at   string
	node *yaml.Node
	line int
	text string
}

// docValues reads the reference block as the worker reads a config, and returns the config it
// makes and each key it sets. The docs tests walk the block through it alone.
func docValues(t *testing.T) (Config, []docValue) {
	t.Helper()
	block, off := docBlock(t)
	lines := strings.Split(string(block), "\n")
	var doc Config
	src, err := decodeYAML(docPath, block, &doc)
	if err != nil {
		t.Fatalf("the reference block of %s is not a config the worker reads:\n%v", docPath, err)
	}
	var values []docValue
	for at, n := range src.at {
		if at != "" {
			values = append(values, docValue{at: at, node: n, line: off + n.Line, text: lines[n.Line-1]})
		}
	}
	sort.Slice(values, func(i, j int) bool { return values[i].line < values[j].line })
	return doc, values
}

// keyPaths are the config's keys, as the docs write them: a map of profiles or tenants is
// "*", the element of a list of mappings "[]"; a key whose value the config holds as it is (a tool's
// parameters) ends there.
func keyPaths(t reflect.Type, path string, out map[string]bool) {
	if path != "" {
		out[path] = true
	}
	switch t.Kind() {
	case reflect.Pointer:
		keyPaths(t.Elem(), path, out)
	case reflect.Map:
		if t.Elem().Kind() != reflect.Interface {
			keyPaths(t.Elem(), path+".*", out)
		}
	case reflect.Slice:
		if t.Elem().Kind() == reflect.Struct { // a list of values is one key
			keyPaths(t.Elem(), path+"[]", out)
		}
	case reflect.Struct:
		if t == reflect.TypeFor[Duration]() {
			return
		}
		for i := range t.NumField() {
			if name := fieldName(t.Field(i)); name != "" {
				keyPaths(t.Field(i).Type, join(path, name), out)
			}
		}
	}
}

var (
	mapKey  = regexp.MustCompile(`^(profiles|tenants)\.[^.\[]+`)
	listIdx = regexp.MustCompile(`\[\d+\]`)
)

// docKey is the key path of a place in the block, in keyPaths' terms.
func docKey(at string) string {
	at = mapKey.ReplaceAllString(at, "$1.*")
	return listIdx.ReplaceAllString(at, "[]")
}

// TestConfigurationDocNamesEveryKey holds docs/configuration.md's reference block to the
// Config struct both ways: the block is a config the worker reads (no key it does not know),
// and it names every key the worker reads.
func TestConfigurationDocNamesEveryKey(t *testing.T) {
	t.Parallel()
	_, values := docValues(t)
	documented := map[string]bool{}
	for _, v := range values {
		if !strings.Contains(v.at, ".parameters.") {
			documented[docKey(v.at)] = true
		}
	}
	code := map[string]bool{}
	keyPaths(reflect.TypeFor[Config](), "", code)
	for key := range code {
		if !documented[key] {
			t.Errorf("%s's reference block lacks %s, a key the worker reads", docPath, key)
		}
	}
	if len(documented) < 100 || len(code) < 100 {
		t.Errorf("compared %d documented keys with %d of the struct: the block was not read whole", len(documented), len(code))
	}
}

// TestConfigurationDocDefaults: each value the reference block shows is the key's default, but
// for docExamples; a zero or empty value the worker fills itself says "default" in its comment.
func TestConfigurationDocDefaults(t *testing.T) {
	t.Parallel()
	doc, values := docValues(t)
	defaults := Config{Profiles: map[string]Profile{"NAME": {Warm: &Warm{}}}, Tenants: map[string]Tenant{"TENANT": {}}}.WithDefaults()
	checked := 0
	for _, v := range values {
		key := docKey(v.at)
		if strings.Contains(key, "[]") || docExamples[key] != "" {
			continue
		}
		got, ok1 := valueAt(reflect.ValueOf(doc), v.at)
		want, ok2 := valueAt(reflect.ValueOf(defaults), v.at)
		if !ok1 || !ok2 || !isLeaf(want) {
			continue
		}
		checked++
		if got.IsZero() && !want.IsZero() {
			if !strings.Contains(v.text, "default") {
				t.Errorf("%s:%d %s shows %v, but the worker's default is %v: show it, or say what fills it (# default: …)", docPath, v.line, key, show(got), show(want))
			}
			continue
		}
		if shown := strings.ReplaceAll(show(got), "$TMPDIR", strings.TrimSuffix(os.TempDir(), "/")); shown != show(want) {
			t.Errorf("%s:%d %s shows %s, but the worker's default is %s", docPath, v.line, key, shown, show(want))
		}
	}
	if checked < 60 {
		t.Errorf("checked %d defaults: the block was not read whole", checked)
	}
}

// atLeast is a minimum a comment states: "at least 3s", "at least 65536".
var atLeast = regexp.MustCompile(`at least (\d+[a-z]*)`)

// TestConfigurationDocMinimums: a minimum the reference block states ("at least N") is the
// one the worker holds: a config with N is read, one just below it is refused naming the key.
func TestConfigurationDocMinimums(t *testing.T) {
	t.Parallel()
	_, values := docValues(t)
	stated := 0
	for _, v := range values {
		m := atLeast.FindStringSubmatch(v.text)
		if m == nil || v.node.Kind != yaml.ScalarNode {
			continue
		}
		stated++
		for _, below := range []bool{false, true} {
			value := minimum(t, m[1], below)
			_, err := Parse(minimalYAML(t, v.at, value))
			switch {
			case below && (err == nil || !strings.Contains(err.Error(), lastKey(v.at))):
				t.Errorf("%s:%d %s states at least %s, yet %v gives %v", docPath, v.line, docKey(v.at), m[1], value, err)
			case !below && err != nil:
				t.Errorf("%s:%d %s states at least %s, yet the worker refuses it: %v", docPath, v.line, docKey(v.at), m[1], err)
			}
		}
	}
	if stated < 4 {
		t.Errorf("found %d minimums in the block, want the four it states (ack_wait, max_output_bytes, max_conversation_bytes, max_queued_bytes)", stated)
	}
}

// minimalYAML is the smallest valid config, its profile named as the block names it, with the
// key at set to value.
func minimalYAML(t *testing.T, at string, value any) []byte {
	t.Helper()
	tree := map[string]any{"profiles": map[string]any{"NAME": map[string]any{
		"model": map[string]any{"name": "m"}, "tools": []any{map[string]any{"name": "read_file"}},
	}}}
	if strings.HasPrefix(at, "tenants.TENANT.") {
		// TENANT is no tenant name: the block's tenant is a valid one granted the profile.
		tree["tenants"] = map[string]any{"tenant": map[string]any{"profiles": []any{"NAME"}}}
		at = "tenants.tenant." + strings.TrimPrefix(at, "tenants.TENANT.")
	}
	node := tree
	parts := strings.Split(at, ".")
	for _, p := range parts[:len(parts)-1] {
		next, ok := node[p].(map[string]any)
		if !ok {
			next = map[string]any{}
			node[p] = next
		}
		node = next
	}
	node[parts[len(parts)-1]] = value
	data, err := yaml.Marshal(tree)
	if err != nil {
		t.Fatal(err)
	}
	return data
}

// minimum is the value a stated minimum ("3s", "65536") names, or the one just below it.
func minimum(t *testing.T, stated string, below bool) any {
	t.Helper()
	if i, err := strconv.ParseInt(stated, 10, 64); err == nil {
		if below {
			i--
		}
		return i
	}
	d, err := time.ParseDuration(stated)
	if err != nil {
		t.Fatalf("at least %s: neither a number nor a duration", stated)
	}
	if below {
		d -= time.Millisecond
	}
	return d.String()
}

// valueAt is the field at a key path of the block; a map's entry is found by its key.
func valueAt(v reflect.Value, at string) (reflect.Value, bool) {
	for part := range strings.SplitSeq(at, ".") {
		if strings.Contains(part, "[") {
			return reflect.Value{}, false
		}
		for v.Kind() == reflect.Pointer {
			if v.IsNil() {
				return reflect.Value{}, false
			}
			v = v.Elem()
		}
		switch v.Kind() {
		case reflect.Struct:
			i, ok := fieldIndex(v.Type())[part]
			if !ok {
				return reflect.Value{}, false
			}
			v = v.Field(i)
		case reflect.Map:
			// A map's entries are not settable: copy one out, which is enough to read it.
			e := v.MapIndex(reflect.ValueOf(part))
			if !e.IsValid() {
				return reflect.Value{}, false
			}
			c := reflect.New(e.Type()).Elem()
			c.Set(e)
			v = c
		default:
			return reflect.Value{}, false
		}
	}
	return v, true
}

// isLeaf says whether v is a value the block shows, not a section.
func isLeaf(v reflect.Value) bool {
	switch v.Kind() {
	case reflect.Struct:
		return v.Type() == reflect.TypeFor[Duration]()
	case reflect.Map, reflect.Slice, reflect.Interface:
		return false
	case reflect.Pointer:
		return v.Type().Elem().Kind() != reflect.Struct
	}
	return true
}

func show(v reflect.Value) string {
	if v.Kind() == reflect.Pointer {
		if v.IsNil() {
			return "null"
		}
		v = v.Elem()
	}
	if d, ok := v.Interface().(Duration); ok {
		return d.Std().String()
	}
	return fmt.Sprint(v.Interface())
}

// lastKey is the last key of a path: what a message about it names, whatever it says of the rest.
func lastKey(at string) string { return at[strings.LastIndex(at, ".")+1:] }
