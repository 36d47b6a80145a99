package agent

import (
	"maps"
	"reflect"
	"slices"
	"strings"

	"github.com/boxcar-run/boxcar/internal/config"
	"github.com/boxcar-run/boxcar/internal/schemagen"
)

// ToolSchema is the JSON Schema rule of one tool declaration (the config path
// "profiles.*.tools[]"), derived from the registry of tool kinds: the kinds there are, the
// fields each one reads, and what each kind's compile checks that a schema can say. A tool
// that a worker would refuse at start is then refused by whatever reads the schema (helm
// install). What it cannot say: a placeholder's parameter and its type, whether parameters
// is a usable schema, an allowlist pattern's syntax, a name declared twice.
func ToolSchema() schemagen.Schema {
	kinds := kindNames()
	all := []any{schemagen.Schema{"properties": schemagen.Schema{"kind": schemagen.Schema{
		"enum":        append([]any{""}, toAny(kinds)...),
		"description": "The tool's kind: " + strings.Join(kinds, ", ") + "; empty means command when command is set, shell for a tool named shell, else builtin.",
	}}}}
	for _, name := range kinds {
		then := notReading(toolKinds[name].fields)
		if s := toolKinds[name].schema; s != nil {
			then = schemagen.Schema{"allOf": []any{then, s}}
		}
		all = append(all, schemagen.Schema{"if": resolvesTo(name), "then": then})
	}
	return schemagen.Schema{"allOf": all}
}

// resolvesTo holds for a declaration whose kind, defaults applied, is kind: config's
// Profile.WithDefaults picks command when a command is set, shell for a tool named shell,
// else builtin.
func resolvesTo(kind string) schemagen.Schema {
	named := schemagen.Schema{"required": []any{"kind"}, "properties": schemagen.Schema{"kind": schemagen.Schema{"const": kind}}}
	unnamed := schemagen.Schema{"not": schemagen.Schema{"required": []any{"kind"}, "properties": schemagen.Schema{"kind": schemagen.Schema{"not": schemagen.Schema{"const": ""}}}}}
	hasCommand := schemagen.Schema{"required": []any{"command"}, "properties": schemagen.Schema{"command": schemagen.Schema{"minItems": 1}}}
	namedShell := schemagen.Schema{"required": []any{"name"}, "properties": schemagen.Schema{"name": schemagen.Schema{"const": "shell"}}}
	var byDefault []any
	switch kind {
	case config.ToolCommand:
		byDefault = []any{unnamed, hasCommand}
	case config.ToolShell:
		byDefault = []any{unnamed, schemagen.Schema{"not": hasCommand}, namedShell}
	case config.ToolBuiltin:
		byDefault = []any{unnamed, schemagen.Schema{"not": hasCommand}, schemagen.Schema{"not": namedShell}}
	default:
		return named // a new kind is only ever chosen by name
	}
	return schemagen.Schema{"anyOf": []any{named, schemagen.Schema{"allOf": byDefault}}}
}

// notReading allows a field a kind does not read only at its zero value, which is how the
// worker sees it (setFields): as not set.
func notReading(reads []string) schemagen.Schema {
	props := schemagen.Schema{}
	t := reflect.TypeFor[config.Tool]()
	for i := range t.NumField() {
		name, _, _ := strings.Cut(t.Field(i).Tag.Get("json"), ",")
		if name == "name" || name == "kind" || slices.Contains(reads, name) {
			continue
		}
		props[name] = zeroOf(t.Field(i).Type)
	}
	return schemagen.Schema{"properties": props}
}

// zeroDuration is a Go duration that parses to zero.
const zeroDuration = `^[-+]?(0|((0+(\.0*)?|\.0+)(ns|us|µs|μs|ms|s|m|h))+)$`

func zeroOf(t reflect.Type) schemagen.Schema {
	switch {
	case t == reflect.TypeFor[config.Duration]():
		return schemagen.Schema{"pattern": zeroDuration, "description": "Not read by this kind of tool."}
	case t.Kind() == reflect.Slice:
		return schemagen.Schema{"maxItems": 0, "description": "Not read by this kind of tool."}
	case t.Kind() == reflect.Map:
		return schemagen.Schema{"maxProperties": 0, "description": "Not read by this kind of tool."}
	default:
		return schemagen.Schema{"enum": []any{"", nil}, "description": "Not read by this kind of tool."}
	}
}

// The kinds' own checks, as far as JSON Schema can state them; each sits next to its compile
// function's checks in kinds.go through the registry.

func builtinSchema() schemagen.Schema {
	return schemagen.Schema{"properties": schemagen.Schema{"name": schemagen.Schema{"enum": toAny(slices.Sorted(maps.Keys(builtins)))}}}
}

// negative is a duration below zero, which a tool's timeout may not be.
var negative = schemagen.Schema{"not": schemagen.Schema{"pattern": `^-.*[1-9]`}}

func commandSchema() schemagen.Schema {
	return schemagen.Schema{
		"required": []any{"command"},
		"properties": schemagen.Schema{
			"command": schemagen.Schema{
				"minItems": 1,
				// The program is literal: a placeholder there would let the model pick it.
				"items": []any{schemagen.Schema{"minLength": 1, "not": schemagen.Schema{"pattern": placeholder.String()}}},
			},
			"timeout":    negative,
			"parameters": schemagen.Schema{"required": []any{"type"}, "properties": schemagen.Schema{"type": schemagen.Schema{"const": "object"}}},
		},
	}
}

func shellSchema() schemagen.Schema {
	allowlist := schemagen.Schema{"required": []any{"policy"}, "properties": schemagen.Schema{"policy": schemagen.Schema{"const": config.PolicyAllowlist}}}
	return schemagen.Schema{
		"properties": schemagen.Schema{
			"policy":  schemagen.Schema{"enum": []any{"", config.PolicyDeny, config.PolicyAllowlist, config.PolicyAsk}},
			"timeout": negative,
		},
		"if":   allowlist,
		"then": schemagen.Schema{"required": []any{"allow"}, "properties": schemagen.Schema{"allow": schemagen.Schema{"minItems": 1}}},
		"else": schemagen.Schema{"properties": schemagen.Schema{"allow": schemagen.Schema{"maxItems": 0}}},
	}
}

func toAny(ss []string) []any {
	out := make([]any, len(ss))
	for i, s := range ss {
		out[i] = s
	}
	return out
}
