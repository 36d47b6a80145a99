package agent_test

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/boxcar-run/boxcar/examples"
	"github.com/boxcar-run/boxcar/internal/agent"
	"github.com/boxcar-run/boxcar/internal/config"
)

// TestBadProfileStopsNew: each mistake an operator can make in a tool declaration stops the
// agent (and so the worker) at start with the profile, the tool and the field named, instead of
// failing every job of the profile.
func TestBadProfileStopsNew(t *testing.T) {
	tests := []struct {
		name      string
		tool      string // one YAML flow mapping, the second tool of profile p
		wantField string // as named in the error: profiles.p.tools[1].<field>: tool "<name>"
		wantTool  string
	}{
		{"not a builtin", `{name: rm_rf}`, "name", "rm_rf"},
		{"unknown kind", `{name: py, kind: python}`, "kind", "py"},
		{"schema does not compile", `{name: x, command: [wc], parameters: {type: object, properties: {a: {type: strng}}}}`, "parameters", "x"},
		{"schema reaches for a file", `{name: x, command: [wc], parameters: {type: object, $ref: "file:///etc/schema.json"}}`, "parameters", "x"},
		{"arguments not an object", `{name: x, command: [wc], parameters: {type: array}}`, "parameters.type", "x"},
		{"placeholder without parameter", `{name: x, command: [wc, "{{path}}"], parameters: {type: object}}`, "command[1]", "x"},
		{"placeholder as the program", `{name: x, command: ["{{prog}}"], parameters: {type: object, properties: {prog: {type: string}}}}`, "command[0]", "x"},
		{"object fills an argv element", `{name: x, command: [wc, "{{o}}"], parameters: {type: object, properties: {o: {type: object}}}}`, "parameters.properties.o.type", "x"},
		{"placeholder's schema is false", `{name: x, command: [wc, "{{p}}"], parameters: {type: object, properties: {p: false}}}`, "parameters.properties.p", "x"},
		{"allow on a command tool", `{name: x, command: [ls], allow: ["ls *"]}`, "allow", "x"},
		{"command on a builtin", `{name: write_file, kind: builtin, command: [cat]}`, "command", "write_file"},
		{"parameters on a builtin", `{name: list_files, parameters: {type: object}}`, "parameters", "list_files"},
		{"unknown policy", `{name: shell, policy: sometimes}`, "policy", "shell"},
		{"allowlist without patterns", `{name: shell, policy: allowlist}`, "allow", "shell"},
		{"allow under deny", `{name: shell, allow: ["ls *"]}`, "allow", "shell"},
		{"parameters on the shell", `{name: sh, kind: shell, parameters: {type: object}}`, "parameters", "sh"},
		{"command on the shell", `{name: sh, kind: shell, command: [sh]}`, "command", "sh"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			yaml := "profiles:\n  p:\n    model: {name: m}\n    tools:\n      - {name: read_file}\n      - " + tt.tool + "\n"
			cfg, err := config.Parse([]byte(yaml))
			if err != nil {
				t.Fatalf("config.Parse: %v (the config layer should leave tool kinds to the agent)", err)
			}
			_, err = agent.New(agent.Config{Profiles: cfg.Profiles})
			if !errors.Is(err, agent.ErrInvalidConfig) {
				t.Fatalf("New: %v, want ErrInvalidConfig", err)
			}
			want := `profiles.p.tools[1].` + tt.wantField + `: tool "` + tt.wantTool + `": `
			if !strings.Contains(err.Error(), want) {
				t.Errorf("New: %v\nwant it to name %s", err, want)
			}
			if strings.Contains(err.Error(), "tools[0]") {
				t.Errorf("New: %v\nblames the valid read_file too", err)
			}
			if cerr := agent.CheckProfiles(cfg.Profiles); cerr == nil || cerr.Error() != err.Error() {
				t.Errorf("CheckProfiles: %v, want the same error as New", cerr)
			}
		})
	}
}

// TestNegativeToolTimeoutStopsNew: config.Parse refuses a negative tool timeout at load
// (config's TestBadConfigsAreRefusedAtLoad); the agent refuses it too in profiles built in
// code, which no load checked.
func TestNegativeToolTimeoutStopsNew(t *testing.T) {
	cfg, err := config.Parse([]byte("profiles:\n  p:\n    model: {name: m}\n    tools:\n      - {name: read_file}\n      - {name: x, command: [wc], timeout: 1s}\n"))
	if err != nil {
		t.Fatal(err)
	}
	cfg.Profiles["p"].Tools[1].Timeout = config.Duration(-time.Second)
	_, err = agent.New(agent.Config{Profiles: cfg.Profiles})
	want := `profiles.p.tools[1].timeout: tool "x": `
	if !errors.Is(err, agent.ErrInvalidConfig) || !strings.Contains(err.Error(), want) {
		t.Fatalf("New: %v, want ErrInvalidConfig naming %s", err, want)
	}
}

// TestBadProfilesAllNamed: every bad declaration of every profile is reported at once, so an
// operator fixes them in one round.
func TestBadProfilesAllNamed(t *testing.T) {
	cfg, err := config.Parse([]byte(`
profiles:
  a:
    model: {name: m}
    tools: [{name: read_fil}, {name: shell, policy: allow}]
  b:
    model: {name: m}
    tools: [{name: x, command: [wc, "{{f}}"]}]
`))
	if err != nil {
		t.Fatal(err)
	}
	_, err = agent.New(agent.Config{Profiles: cfg.Profiles})
	for _, want := range []string{`profiles.a.tools[0].name: tool "read_fil"`, `profiles.a.tools[1].policy: tool "shell"`, `profiles.b.tools[0].command[1]: tool "x"`} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("New: %v\nwant it to name %s", err, want)
		}
	}
}

// TestRunUsesPrecompiledTools: a run that names its profile gets the tools New compiled for it,
// whatever the request's own copy of the profile holds.
func TestRunUsesPrecompiledTools(t *testing.T) {
	cfg, err := config.Parse(examples.Config)
	if err != nil {
		t.Fatal(err)
	}
	s := newScript(t,
		toolCalls(100, call{"c1", "csv_stats", `{"path":"sales.csv"}`}),
		final("done"))
	a := newAgent(t, s, func(c *agent.Config) { c.Profiles = cfg.Profiles })
	sb := newFakeSandbox(map[string]string{"sales.csv": "region,amount\nnorth,3\n"})
	req := request(cfg.Profiles["csv-analyst"], sb)
	req.ProfileName = "csv-analyst"
	req.Profile.Tools = []config.Tool{{Name: "shell", Kind: config.ToolShell, Policy: config.PolicyAllowlist, Allow: []string{"*"}}}
	if _, err := a.Run(context.Background(), req); err != nil {
		t.Fatalf("Run: %v", err)
	}
	var offered []string
	for _, tl := range s.requests()[0].body["tools"].([]any) {
		offered = append(offered, tl.(map[string]any)["function"].(map[string]any)["name"].(string))
	}
	if want := []string{"list_files", "read_file", "write_file", "csv_stats"}; !slices.Equal(offered, want) {
		t.Errorf("tools offered = %v, want the compiled csv-analyst tools %v", offered, want)
	}
	argvs := sb.argvs()
	if len(argvs) != 1 || argvs[0][0] != "python3" || argvs[0][len(argvs[0])-1] != "sales.csv" {
		t.Errorf("commands run = %q, want csv_stats's python3 … sales.csv", argvs)
	}

	req.ProfileName = "nope"
	if _, err := a.Run(context.Background(), req); !errors.Is(err, agent.ErrInvalidRequest) {
		t.Errorf("Run with an unknown profile name: %v, want ErrInvalidRequest", err)
	}
}
