package agent

import (
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"regexp"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/santhosh-tekuri/jsonschema/v6"

	"github.com/boxcar-run/boxcar/internal/config"
	"github.com/boxcar-run/boxcar/internal/schemagen"
)

// toolKinds is the registry of the tool kinds a profile can declare (config.Tool.Kind). Adding
// a kind is adding its entry here, next to a type that implements tool: the entry says which
// fields of a declaration the kind reads and checks them, so a mistake in a profile stops the
// worker at start instead of failing every job that uses it.
var toolKinds = map[string]toolKind{
	config.ToolBuiltin: {fields: []string{"description"}, compile: compileBuiltin, schema: builtinSchema()},
	config.ToolCommand: {fields: []string{"description", "command", "parameters", "timeout"}, compile: compileCommand, schema: commandSchema()},
	config.ToolShell:   {fields: []string{"description", "policy", "allow", "timeout"}, compile: compileShell, schema: shellSchema()},
}

// toolKind turns one declaration into a maker of the tool.
type toolKind struct {
	// fields are the config.Tool fields, by their YAML names, a declaration of this kind may
	// set besides name and kind. Any other field set is refused: a command tool's "allow" or a
	// built-in's "command" would be silently ignored otherwise.
	fields []string
	// compile checks the declaration and returns the maker of its tool. It reports each
	// problem through bad, naming the field relative to the tool ("command[0]", "allow[1]").
	compile func(t config.Tool, bad problemFunc) maker
	// schema states, as JSON Schema, what compile checks that a schema can say (ToolSchema
	// adds fields): helm install then refuses the declaration, not the worker's start.
	schema schemagen.Schema
}

// problemFunc records a problem with a field of a tool declaration.
type problemFunc func(field, format string, args ...any)

// maker builds a tool for one run. Everything that can fail was checked when it was made.
type maker func(env runEnv) tool

// runEnv is what a run gives its tools: where commands run, the run's limits and who approves.
type runEnv struct {
	sb       Sandbox
	limits   config.Limits
	jobID    string
	approver Approver
}

// runner is where and how long commands run: the tool's own timeout or the profile's command
// timeout, within the job's (config.Limits.ToolTimeout).
func (e runEnv) runner(timeout config.Duration) runner {
	return runner{sb: e.sb, timeout: time.Duration(e.limits.ToolTimeout(timeout)), maxOutput: e.limits.MaxOutputBytes}
}

// builtins are the built-in file tools by name, confined to the workdir.
var builtins = map[string]func(files fileTools, description string) tool{
	"list_files": func(f fileTools, d string) tool { return listFiles{f, d} },
	"read_file":  func(f fileTools, d string) tool { return readFile{f, d} },
	"write_file": func(f fileTools, d string) tool { return writeFile{f, d} },
}

func compileBuiltin(t config.Tool, bad problemFunc) maker {
	build, ok := builtins[t.Name]
	if !ok {
		bad("name", "%q is not a built-in tool (%s); give a command to declare a command tool, or kind: shell",
			t.Name, strings.Join(slices.Sorted(maps.Keys(builtins)), ", "))
		return nil
	}
	return func(env runEnv) tool {
		return build(fileTools{sb: env.sb, maxOutput: env.limits.MaxOutputBytes}, t.Description)
	}
}

func compileCommand(t config.Tool, bad problemFunc) maker {
	if len(t.Command) == 0 {
		bad("command", "a command tool needs an argv template, e.g. [wc, -l, \"{{path}}\"]")
		return nil
	}
	if t.Command[0] == "" || placeholderName(t.Command[0]) != "" {
		// A program chosen by the model would make the tool a shell without its policy.
		bad("command[0]", "%q must name the program literally", t.Command[0])
	}
	if t.Timeout < 0 {
		bad("timeout", "%s is negative; use a positive duration, or leave it out for the profile's command_timeout", t.Timeout)
	}
	if t.Parameters != nil && t.Parameters["type"] != "object" {
		bad("parameters.type", "is %v; the arguments of a tool are a JSON object: type: object", t.Parameters["type"])
	}
	props, _ := t.Parameters["properties"].(map[string]any)
	for i, el := range t.Command {
		name := placeholderName(el)
		if name == "" {
			continue
		}
		prop, ok := props[name]
		if !ok {
			bad(fmt.Sprintf("command[%d]", i), "placeholder %s has no matching entry in parameters.properties", el)
			continue
		}
		if field, msg := unfillable(prop); msg != "" {
			bad("parameters.properties."+name+field, "%s", msg)
		}
		if i > 0 && takesNext(t.Command[i-1]) && !required(t.Parameters, name) {
			bad(fmt.Sprintf("command[%d]", i), "optional placeholder %s follows the flag %q: when the model leaves %s out its element is dropped, "+
				"and %q takes the next element as its value; list %s in parameters.required, or, for an argument that is no flag's value, put \"--\" before it",
				el, t.Command[i-1], name, t.Command[i-1], name)
		}
	}
	return func(env runEnv) tool { return commandTool{runner: env.runner(t.Timeout), spec: t} }
}

// takesNext: the literal argv element is a flag that may take the next element as its value
// (-m, --max-count), not "--", "-" (standard input) or a flag holding its value (--color=never).
// A placeholder is no literal: its value is one argument whatever it holds.
func takesNext(el string) bool {
	return strings.HasPrefix(el, "-") && el != "-" && el != "--" && !strings.Contains(el, "=") && placeholderName(el) == ""
}

// required: the tool's parameters list name as required, so its placeholder is never dropped.
func required(params map[string]any, name string) bool {
	list, _ := params["required"].([]any)
	return slices.Contains(list, any(name))
}

// unfillable says why a placeholder's property schema admits no value that could fill an argv
// element, one string, and the field below the property to blame; "" when some value can. The
// schema may be a boolean, as JSON Schema allows: true states no type, as {} does, and false
// admits nothing. Any other shape is left to the schema's compilation.
func unfillable(prop any) (field, msg string) {
	switch schema := prop.(type) {
	case bool:
		if !schema {
			return "", "is false, which no argument matches; give the placeholder's parameter a schema such as {type: string}"
		}
	case map[string]any:
		// An object or array argument could never fill an argv element.
		if typ, _ := schema["type"].(string); typ == "object" || typ == "array" || typ == "null" {
			return ".type", fmt.Sprintf("%q cannot fill an argv element; use string, number, integer or boolean", typ)
		}
	}
	return "", ""
}

func compileShell(t config.Tool, bad problemFunc) maker {
	switch t.Policy {
	case config.PolicyDeny, config.PolicyAsk:
		if len(t.Allow) > 0 {
			bad("allow", "is only read under policy: allowlist; under %s it would change nothing", t.Policy)
		}
	case config.PolicyAllowlist:
		if len(t.Allow) == 0 {
			bad("allow", "the allowlist policy needs at least one pattern, e.g. \"git status\" or \"ls *\"")
		}
	default:
		bad("policy", "%q is not a policy; use deny, allowlist or ask", t.Policy)
	}
	if t.Timeout < 0 {
		bad("timeout", "%s is negative; use a positive duration, or leave it out for the profile's command_timeout", t.Timeout)
	}
	allow := make([]argvPattern, 0, len(t.Allow))
	for i, p := range t.Allow {
		ap, err := compileAllow(p)
		if err != nil {
			bad(fmt.Sprintf("allow[%d]", i), "%q: %v", p, err)
			continue
		}
		allow = append(allow, ap)
	}
	return func(env runEnv) tool {
		return shellTool{runner: env.runner(t.Timeout), spec: t, jobID: env.jobID, approver: env.approver,
			approvalTimeout: time.Duration(env.limits.ApprovalTimeout), allow: allow}
	}
}

// compiledTool is one checked declaration: what the model is told, the compiled schema of its
// arguments and the maker of the tool.
type compiledTool struct {
	def    definition
	schema *jsonschema.Schema
	make   maker
}

// compiledTools are a profile's tools, checked and compiled once; each run binds them to its
// sandbox.
type compiledTools struct {
	order  []string
	byName map[string]compiledTool
}

// toolProblem is a mistake in one tool declaration.
type toolProblem struct {
	index       int
	tool, field string
	msg         string
}

// compileTools checks every declaration of a profile (its defaults applied) with its kind and
// compiles the argument schemas. It reports every problem, not only the first.
func compileTools(cache *schemaCache, tools []config.Tool) (*compiledTools, []toolProblem) {
	ct := &compiledTools{byName: make(map[string]compiledTool, len(tools))}
	var problems []toolProblem
	for i, t := range tools {
		n := len(problems)
		bad := func(field, format string, args ...any) {
			problems = append(problems, toolProblem{index: i, tool: t.Name, field: field, msg: fmt.Sprintf(format, args...)})
		}
		kind, ok := toolKinds[t.Kind]
		if !ok {
			bad("kind", "%q is not a tool kind; use %s", t.Kind, strings.Join(kindNames(), ", "))
			continue
		}
		for _, f := range setFields(t) {
			if !slices.Contains(kind.fields, f) {
				bad(f, "is not read by a %s tool (it reads %s)", t.Kind, strings.Join(kind.fields, ", "))
			}
		}
		if _, dup := ct.byName[t.Name]; dup {
			bad("name", "%q is declared twice", t.Name)
		}
		mk := kind.compile(t, bad)
		if len(problems) > n {
			continue
		}
		def := mk(runEnv{}).Definition() // a definition depends on the declaration alone
		schema, err := cache.compile(def.Parameters)
		if err != nil {
			bad("parameters", "not a usable JSON Schema: %s", describeSchemaError(err))
			continue
		}
		ct.order = append(ct.order, def.Name)
		ct.byName[def.Name] = compiledTool{def: def, schema: schema, make: mk}
	}
	return ct, problems
}

// bind makes the tools of one run.
func (ct *compiledTools) bind(env runEnv) *toolset {
	ts := &toolset{order: ct.order, byName: make(map[string]toolEntry, len(ct.order))}
	for _, name := range ct.order {
		c := ct.byName[name]
		ts.byName[name] = toolEntry{tool: c.make(env), def: c.def, schema: c.schema}
	}
	return ts
}

// setFields lists the fields of a declaration that are set, besides name and kind, by their
// YAML names.
func setFields(t config.Tool) []string {
	b, err := json.Marshal(t)
	if err != nil {
		return nil // config.Tool is plain data; Marshal fails only on a NaN in parameters
	}
	var m map[string]json.RawMessage
	if err := json.Unmarshal(b, &m); err != nil {
		return nil
	}
	delete(m, "name")
	delete(m, "kind")
	fields := slices.Collect(maps.Keys(m))
	sort.Strings(fields)
	return fields
}

func kindNames() []string { return slices.Sorted(maps.Keys(toolKinds)) }

var placeholder = regexp.MustCompile(`^\{\{([a-zA-Z0-9_]+)\}\}$`)

// placeholderName returns the parameter name of an argv element "{{name}}", or "" if the
// element is literal.
func placeholderName(el string) string {
	if m := placeholder.FindStringSubmatch(el); m != nil {
		return m[1]
	}
	return ""
}

// CheckProfiles checks the tools of every profile with their kinds and compiles their
// schemas, as New does with Config.Profiles. A worker calls it (through New) at start, so a bad
// profile stops it there; the error names the profile, the tool and the field.
func CheckProfiles(profiles map[string]config.Profile) error {
	_, err := compileProfiles(&schemaCache{}, profiles)
	return err
}

func compileProfiles(cache *schemaCache, profiles map[string]config.Profile) (map[string]*compiledTools, error) {
	out := make(map[string]*compiledTools, len(profiles))
	var errs []error
	for _, name := range slices.Sorted(maps.Keys(profiles)) {
		if err := profiles[name].Complete(); err != nil {
			errs = append(errs, fmt.Errorf("%w: profiles.%s: %w", ErrInvalidConfig, name, err))
			continue
		}
		ct, problems := compileTools(cache, profiles[name].Tools)
		for _, p := range problems {
			// A FieldError, so that the worker and check-config can name the line in the file.
			errs = append(errs, &config.FieldError{Err: ErrInvalidConfig,
				Path: fmt.Sprintf("profiles.%s.tools[%d].%s", name, p.index, p.field), Msg: fmt.Sprintf("tool %q: %s", p.tool, p.msg)})
		}
		out[name] = ct
	}
	return out, errors.Join(errs...)
}

// describeSchemaError puts a schema's compile error on one line: a schema that breaks the
// metaschema names each failing location, as argument errors do.
func describeSchemaError(err error) string {
	var se *jsonschema.SchemaValidationError
	if errors.As(err, &se) {
		return describeValidation(se.Err)
	}
	return err.Error()
}
