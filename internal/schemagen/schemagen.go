// Package schemagen writes JSON Schema (draft-07) documents from Go types, so that a schema
// published for a format can never drift from the type that decodes it. The structure comes
// from the type: fields by their json names, their JSON types, which are required (no
// omitempty/omitzero), no unknown keys. The rules a type cannot say (ranges, patterns, enums,
// conditions) are added by path, next to the validation code they restate.
package schemagen

import (
	"encoding/json"
	"fmt"
	"maps"
	"reflect"
	"slices"
	"strings"
	"time"
)

// Schema is one JSON Schema node.
type Schema = map[string]any

// Options shape a generated schema.
type Options struct {
	// Types gives the schema of a named type that does not encode as its Go kind suggests,
	// such as a duration written as a string.
	Types map[reflect.Type]Schema
	// Rules adds keywords to the node at a path, replacing generated ones of the same name.
	// A path joins json names with "."; "*" is a map's values and "[]" a slice's elements:
	// "" is the root, "nats.max_deliver", "profiles.*.tools[].name".
	Rules map[string]Schema
	// Omit drops properties by path, as if the type had no such field.
	Omit []string
	// YAMLScalars describes YAML as config.Parse reads it, which turns a number or boolean
	// into a string where the field is a string: such a field takes all three, unless a rule
	// constrains its text (pattern, enum, const, length), where a number is a mistake.
	YAMLScalars bool
}

// Generate returns the schema of v's type. Every rule and omission must name a node that
// exists (or lies under an omitted one), so a renamed field fails here rather than silently losing its rule.
func Generate(v any, o Options) (Schema, error) {
	g := &gen{o: o, used: map[string]bool{}}
	s := g.node(reflect.TypeOf(v), "")
	var unused []string
	for p := range o.Rules {
		if !g.used[p] && !omitted(o.Omit, p) {
			unused = append(unused, p)
		}
	}
	for _, p := range o.Omit {
		if !g.used["omit:"+p] {
			unused = append(unused, p)
		}
	}
	if len(unused) > 0 {
		slices.Sort(unused)
		return nil, fmt.Errorf("schemagen: rules for paths the type does not have: %s", strings.Join(unused, ", "))
	}
	return s, nil
}

// Marshal writes a schema as indented JSON with a trailing newline, keys sorted, the form
// checked into the repository.
func Marshal(s Schema) ([]byte, error) {
	data, err := json.MarshalIndent(s, "", "  ")
	if err != nil {
		return nil, fmt.Errorf("schemagen: %w", err)
	}
	return append(data, '\n'), nil
}

type gen struct {
	o    Options
	used map[string]bool
}

var timeType = reflect.TypeFor[time.Time]()

func (g *gen) node(t reflect.Type, path string) Schema {
	nullable := false
	for t.Kind() == reflect.Pointer {
		t, nullable = t.Elem(), true
	}
	var s Schema
	switch {
	case g.o.Types[t] != nil:
		s = maps.Clone(g.o.Types[t])
	case t == timeType:
		// What encoding/json's time.Time accepts: RFC 3339 with an optional fraction.
		s = Schema{"type": "string", "pattern": `^[0-9]{4}-[0-9]{2}-[0-9]{2}[Tt][0-9]{2}:[0-9]{2}:[0-9]{2}(\.[0-9]+)?([Zz]|[+-][0-9]{2}:[0-9]{2})$`}
	default:
		s = g.kind(t, path)
	}
	if nullable {
		if typ, ok := s["type"].(string); ok {
			s["type"] = []any{typ, "null"}
		}
	}
	r, ruled := g.o.Rules[path]
	if g.o.YAMLScalars && s["type"] == "string" && !constrainsText(r) {
		s["type"] = []any{"string", "number", "boolean"}
	}
	if ruled {
		g.used[path] = true
		maps.Copy(s, r)
	}
	return s
}

func (g *gen) kind(t reflect.Type, path string) Schema {
	switch t.Kind() {
	case reflect.Bool:
		return Schema{"type": "boolean"}
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		return Schema{"type": "integer"}
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		return Schema{"type": "integer", "minimum": 0}
	case reflect.Float32, reflect.Float64:
		return Schema{"type": "number"}
	case reflect.String:
		return Schema{"type": "string"}
	case reflect.Interface:
		return Schema{}
	case reflect.Slice, reflect.Array:
		return Schema{"type": "array", "items": g.node(t.Elem(), path+"[]")}
	case reflect.Map:
		if t.Key().Kind() != reflect.String {
			panic(fmt.Sprintf("schemagen: %s: map keys must be strings", path))
		}
		if t.Elem().Kind() == reflect.Interface {
			return Schema{"type": "object"}
		}
		return Schema{"type": "object", "additionalProperties": g.node(t.Elem(), join(path, "*"))}
	case reflect.Struct:
		return g.object(t, path)
	}
	panic(fmt.Sprintf("schemagen: %s: no JSON form for %s", path, t))
}

func (g *gen) object(t reflect.Type, path string) Schema {
	props := Schema{}
	var required []any
	for i := range t.NumField() {
		f := t.Field(i)
		if !f.IsExported() {
			continue
		}
		name, opts, _ := strings.Cut(f.Tag.Get("json"), ",")
		if name == "-" {
			continue
		}
		if name == "" {
			name = f.Name
		}
		p := join(path, name)
		if slices.Contains(g.o.Omit, p) {
			g.used["omit:"+p] = true
			continue
		}
		props[name] = g.node(f.Type, p)
		if !strings.Contains(","+opts+",", ",omitempty,") && !strings.Contains(","+opts+",", ",omitzero,") {
			required = append(required, name)
		}
	}
	s := Schema{"type": "object", "properties": props, "additionalProperties": false}
	if len(required) > 0 {
		s["required"] = required
	}
	return s
}

// omitted reports whether path is at or below an omitted one: its rule has nothing to apply to.
func omitted(omit []string, path string) bool {
	for _, o := range omit {
		if path == o || strings.HasPrefix(path, o+".") || strings.HasPrefix(path, o+"[]") {
			return true
		}
	}
	return false
}

func constrainsText(r Schema) bool {
	for _, k := range []string{"pattern", "enum", "const", "minLength", "maxLength"} {
		if _, ok := r[k]; ok {
			return true
		}
	}
	return false
}

func join(path, name string) string {
	if path == "" {
		return name
	}
	return path + "." + name
}
