package config

import "encoding/json"

// A profile goes whole into every run's manifest (its spec), whose readers refuse a document of
// more values or deeper nesting than a run makes (provenance): a profile past these bounds,
// a tool's parameters schema with a huge enum or nested far down, would run jobs whose
// manifests no reader takes, the worker's own included. A profile holds a few hundred values.
const (
	MaxProfileValues = 1 << 14
	MaxProfileDepth  = 64
)

// validateSize reports a profile past MaxProfileValues values or MaxProfileDepth levels
// through bad.
func (p Profile) validateSize(bad func(field, format string, args ...any)) {
	data, err := json.Marshal(p)
	if err != nil {
		bad("tools", "cannot be written as JSON: %v", err)
		return
	}
	var v any
	if err := json.Unmarshal(data, &v); err != nil {
		bad("tools", "cannot be read back as JSON: %v", err)
		return
	}
	values, depth := jsonSize(v, 1)
	if values > MaxProfileValues {
		bad("tools", "the profile holds %d JSON values (its tools' parameters schemas most of all); at most %d: every run's manifest names the profile whole", values, MaxProfileValues)
	}
	if depth > MaxProfileDepth {
		bad("tools", "the profile nests %d levels deep (a tool's parameters schema); at most %d: every run's manifest names the profile whole", depth, MaxProfileDepth)
	}
}

// jsonSize is how many values v holds, itself included, and how deep it nests.
func jsonSize(v any, depth int) (values, deepest int) {
	values, deepest = 1, depth
	var elems []any
	switch t := v.(type) {
	case map[string]any:
		for _, e := range t {
			elems = append(elems, e)
		}
	case []any:
		elems = t
	}
	for _, e := range elems {
		n, d := jsonSize(e, depth+1)
		values, deepest = values+n, max(deepest, d)
	}
	return values, deepest
}
