package agent_test

import (
	"testing"

	"github.com/santhosh-tekuri/jsonschema/v6"

	"github.com/boxcar-run/boxcar/examples"
	"github.com/boxcar-run/boxcar/internal/agent"
	"github.com/boxcar-run/boxcar/internal/config"
	"github.com/boxcar-run/boxcar/internal/schemagen"
	"github.com/boxcar-run/boxcar/internal/schemagen/schematest"
)

// toolsSchema is the worker config's schema with the tool rule, as cmd/schemagen writes it.
func toolsSchema(t *testing.T) *jsonschema.Schema {
	t.Helper()
	o := config.SchemaOptions()
	o.Rules["profiles.*.tools[]"] = agent.ToolSchema()
	s, err := schemagen.Generate(config.Config{}, o)
	if err != nil {
		t.Fatal(err)
	}
	return schematest.Compile(t, s)
}

// TestToolSchemaAgreesWithTheWorker (issue 12): the schema the chart and editors read accepts
// and refuses the tool declarations that the worker accepts and refuses at start (config.Parse,
// then the kinds' own checks), so helm install refuses an unknown kind or a field the kind
// does not read instead of a pod crash-looping.
func TestToolSchemaAgreesWithTheWorker(t *testing.T) {
	v := toolsSchema(t)
	if err := schematest.ValidateYAML(v, examples.Config); err != nil {
		t.Errorf("the schema refuses the example config: %v", err)
	}
	tests := []struct {
		name  string
		tools string
		// schemaCannot marks a mistake the worker refuses that has no JSON Schema form.
		schemaCannot bool
	}{
		// Accepted by both.
		{name: "builtins", tools: "[{name: read_file}, {name: list_files, description: Lists}, {name: write_file, kind: builtin}]"},
		{name: "command by default", tools: "[{name: wc, command: [wc, -l, '{{path}}'], parameters: {type: object, properties: {path: {type: string}}, required: [path]}, timeout: 10s}]"},
		{name: "command named", tools: "[{name: date, kind: command, command: [date]}]"},
		{name: "shell by name", tools: "[{name: shell}]"},
		{name: "shell named otherwise", tools: "[{name: sh, kind: shell, policy: ask, timeout: 1m}]"},
		{name: "shell allowlist", tools: "[{name: shell, policy: allowlist, allow: ['git status', 'ls *']}]"},
		{name: "empty kind takes the default", tools: "[{name: read_file, kind: ''}]"},
		{name: "fields at their zero value count as unset", tools: "[{name: read_file, command: [], timeout: 0s, allow: [], policy: '', parameters: {}}]"},
		{name: "shell deny with an empty allowlist", tools: "[{name: shell, policy: deny, allow: []}]"},
		{name: "placeholder whose schema is true", tools: "[{name: cat, command: [cat, '{{path}}'], parameters: {type: object, properties: {path: true}, required: [path]}}]"},

		// Refused by both.
		{name: "unknown kind", tools: "[{name: fetch, kind: http}]"},
		{name: "kind not a string", tools: "[{name: read_file, kind: 3}]"},
		{name: "unknown built-in", tools: "[{name: delete_file}]"},
		{name: "built-in with a timeout", tools: "[{name: read_file, timeout: 5s}]"},
		{name: "built-in with a policy", tools: "[{name: read_file, policy: ask}]"},
		{name: "built-in with parameters", tools: "[{name: read_file, kind: builtin, parameters: {type: object}}]"},
		{name: "command kind without a command", tools: "[{name: wc, kind: command}]"},
		{name: "command with an allowlist", tools: "[{name: wc, command: [wc], allow: ['wc *']}]"},
		{name: "command with a policy", tools: "[{name: wc, command: [wc], policy: ask}]"},
		{name: "command program from a placeholder", tools: "[{name: run, command: ['{{prog}}'], parameters: {type: object, properties: {prog: {type: string}}}}]"},
		{name: "command program empty", tools: "[{name: run, command: ['', x]}]"},
		{name: "command parameters not an object schema", tools: "[{name: wc, command: [wc], parameters: {type: string}}]"},
		{name: "command parameters without a type", tools: "[{name: wc, command: [wc], parameters: {properties: {}}}]"},
		{name: "command negative timeout", tools: "[{name: wc, command: [wc], timeout: -5s}]"},
		{name: "shell with a command", tools: "[{name: sh, kind: shell, command: [sh]}]"},
		{name: "shell with parameters", tools: "[{name: shell, parameters: {type: object}}]"},
		{name: "shell unknown policy", tools: "[{name: shell, policy: sometimes}]"},
		{name: "shell allowlist without patterns", tools: "[{name: shell, policy: allowlist}]"},
		{name: "shell deny with patterns", tools: "[{name: shell, allow: ['ls *']}]"},
		{name: "shell ask with patterns", tools: "[{name: shell, policy: ask, allow: ['ls *']}]"},
		{name: "shell negative timeout", tools: "[{name: shell, timeout: -1m}]"},

		// Refused by the worker only: no JSON Schema form (the chart's templates check the first).
		{name: "placeholder without its parameter", tools: "[{name: echo, command: [echo, '{{msg}}']}]", schemaCannot: true},
		{name: "placeholder whose schema is false", tools: "[{name: cat, command: [cat, '{{path}}'], parameters: {type: object, properties: {path: false}}}]", schemaCannot: true},
		{name: "placeholder of an object parameter", tools: "[{name: echo, command: [echo, '{{msg}}'], parameters: {type: object, properties: {msg: {type: object}}}}]", schemaCannot: true},
		{name: "parameters not a usable schema", tools: "[{name: echo, command: [echo], parameters: {type: object, properties: {x: {type: 5}}}}]", schemaCannot: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			doc := "profiles:\n  p:\n    model: {name: m}\n    tools: " + tt.tools + "\n"
			werr := workerRefuses(doc)
			serr := schematest.ValidateYAML(v, []byte(doc))
			switch {
			case tt.schemaCannot:
				if werr == nil {
					t.Errorf("the worker accepts it, want it refused:\n%s", doc)
				}
				if serr != nil {
					t.Errorf("the schema now refuses it (%v): move the case up", serr)
				}
			case (werr == nil) != (serr == nil):
				t.Errorf("the worker and the schema disagree:\nworker: %v\nschema: %v\n%s", werr, serr, doc)
			}
		})
	}
}

// workerRefuses is what a worker does with a config at start: Parse, then the tool kinds'
// checks.
func workerRefuses(doc string) error {
	cfg, err := config.Parse([]byte(doc))
	if err != nil {
		return err
	}
	return agent.CheckProfiles(cfg.Profiles)
}
