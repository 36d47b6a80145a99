package config_test

import (
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/boxcar-run/boxcar/internal/config"
)

// fieldErrors returns the FieldErrors err holds, in order.
func fieldErrors(t *testing.T, err error) []*config.FieldError {
	t.Helper()
	var out []*config.FieldError
	var walk func(error)
	walk = func(e error) {
		if j, ok := e.(interface{ Unwrap() []error }); ok {
			for _, c := range j.Unwrap() {
				walk(c)
			}
			return
		}
		var fe *config.FieldError
		if !errors.As(e, &fe) {
			t.Fatalf("%v (%T) is not a FieldError", e, e)
		}
		out = append(out, fe)
	}
	walk(err)
	return out
}

// TestParsePlacesEveryProblem: each kind of mistake is a FieldError with the line and column of
// the key or value at fault and its key path; what the message says in words is the golden
// test's (internal/workercmd, check-config).
func TestParsePlacesEveryProblem(t *testing.T) {
	tests := []struct {
		name string
		yaml string
		want []config.FieldError // Path, Line, Column
	}{
		{"unknown key", "profiles:\n  p:\n    model: {name: m}\n    tools: [{name: read_file}]\n    sandbox:\n      memmory: 1Gi\n",
			[]config.FieldError{{Path: "profiles.p.sandbox.memmory", Line: 6, Column: 7}}},
		{"string for an integer", "concurrency: \"two\"\n" + profile(""), []config.FieldError{{Path: "concurrency", Line: 1, Column: 14}}},
		{"fraction for an integer", "nats:\n  max_deliver: 1.5\n" + profile(""), []config.FieldError{{Path: "nats.max_deliver", Line: 2, Column: 16}}},
		{"yes for a boolean", "store: {path_style: yes}\n" + profile(""), []config.FieldError{{Path: "store.path_style", Line: 1, Column: 21}}},
		{"list for a mapping", "model: [x]\n" + profile(""), []config.FieldError{{Path: "model", Line: 1, Column: 8}}},
		{"mapping for a list", profile("tools: {name: read_file}"), []config.FieldError{{Path: "profiles.p.tools", Line: 4, Column: 12}}},
		{"number for a duration", "nats: {ack_wait: 60}\n" + profile(""), []config.FieldError{{Path: "nats.ack_wait", Line: 1, Column: 18}}},
		{"bad duration", profile("limits: {job_timeout: 5 minutes}"), []config.FieldError{{Path: "profiles.p.limits.job_timeout", Line: 5, Column: 27}}},
		{"key twice", "concurrency: 1\nconcurrency: 2\n" + profile(""), []config.FieldError{{Path: "concurrency", Line: 2, Column: 1}}},
		{"second document", profile("") + "---\nconcurrency: 1\n", []config.FieldError{{Line: 5, Column: 1}}},
		{"syntax", "profiles:\n  p:\n    model: {name: m\n", []config.FieldError{{Line: 3}}},
		{"syntax, scanner", "a: 1\nb: c: d\n", []config.FieldError{{Line: 2}}},
		{"merge key", "base: &b {name: m}\nprofiles:\n  p:\n    model: {<<: *b}\n    tools: [{name: read_file}]\n", []config.FieldError{{Path: "base", Line: 1, Column: 1}, {Path: "profiles.p.model", Line: 4, Column: 13}}},
		{"every problem, in file order", "concurrency: x\nnats: {replicas: y}\n" + profile("pids: 1"),
			[]config.FieldError{{Path: "concurrency", Line: 1, Column: 14}, {Path: "nats.replicas", Line: 2, Column: 18}, {Path: "profiles.p.pids", Line: 7, Column: 5}}},
		// Validate's problems, placed at the key, or at the nearest key there for a missing one.
		{"invalid value", "concurrency: -1\n" + profile(""), []config.FieldError{{Path: "concurrency", Line: 1, Column: 14}}},
		{"missing key", "profiles:\n  p:\n    tools: [{name: read_file}]\n", []config.FieldError{{Path: "profiles.p.model.name", Line: 3, Column: 5}}},
		{"tool twice", profile("tools: [{name: a}, {name: a}]"), []config.FieldError{{Path: "profiles.p.tools[1].name", Line: 4, Column: 31}}},
		{"empty file", "", []config.FieldError{{Path: "profiles", Line: 1, Column: 1}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := config.Parse([]byte(tt.yaml))
			if !errors.Is(err, config.ErrInvalid) {
				t.Fatalf("Parse: %v, want ErrInvalid\n%s", err, tt.yaml)
			}
			var got []config.FieldError
			for _, fe := range fieldErrors(t, err) {
				got = append(got, config.FieldError{Path: fe.Path, Line: fe.Line, Column: fe.Column})
				if fe.Msg == "" {
					t.Errorf("%s: no message", fe.Path)
				}
			}
			if !reflect.DeepEqual(got, tt.want) {
				t.Errorf("Parse: %v\nplaced %+v\nwant   %+v\n%s", err, got, tt.want, tt.yaml)
			}
		})
	}
}

// TestParseReadsYAML12: n, yes and off are text, as keys and where text goes (under YAML 1.1,
// which sigs.k8s.io/yaml read, a parameter named n became "false"); what the old reader
// accepted in a string or integer field still reads the same.
func TestParseReadsYAML12(t *testing.T) {
	cfg, err := config.Parse([]byte(`
metrics_addr: off
nats: {job_max_bytes: 1e8}
profiles:
  n:
    description: yes
    system_prompt: true
    model: {name: m, seed: 0x10}
    sandbox: {image: no, cpu: 2}
    tools:
      - name: head
        command: [head, -n, "{{n}}"]
        parameters:
          type: object
          properties:
            n: {type: string}
            on: {type: integer, maximum: 3}
`))
	if err != nil {
		t.Fatal(err)
	}
	p, ok := cfg.Profiles["n"]
	if !ok {
		t.Fatalf("profiles %v, want one named n", cfg.Profiles)
	}
	props, _ := p.Tools[0].Parameters["properties"].(map[string]any)
	wantProps := map[string]any{"n": map[string]any{"type": "string"}, "on": map[string]any{"type": "integer", "maximum": float64(3)}}
	if !reflect.DeepEqual(props, wantProps) {
		t.Errorf("parameters.properties = %#v, want %#v", props, wantProps)
	}
	for field, got := range map[string]any{
		"metrics_addr": cfg.MetricsAddr, "description": p.Description, "system_prompt": p.SystemPrompt,
		"sandbox.image": p.Sandbox.Image, "sandbox.cpu": p.Sandbox.CPU, "model.seed": *p.Model.Seed,
		"nats.job_max_bytes": cfg.NATS.JobMaxBytes,
	} {
		want := map[string]any{"metrics_addr": "off", "description": "yes", "system_prompt": "true", "sandbox.image": "no",
			"sandbox.cpu": "2", "model.seed": int64(16), "nats.job_max_bytes": int64(100_000_000)}[field]
		if got != want {
			t.Errorf("%s = %#v, want %#v", field, got, want)
		}
	}
}

// TestLoadNamesTheFile: Load's problems start with the file's name, and Place puts a problem a
// later check found (here one made by hand, as the agent makes them) at its key.
func TestLoadNamesTheFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "boxcar.yaml")
	if err := os.WriteFile(path, []byte(profile("tools:\n  - name: read_file\n  - {name: x, command: [wc]}")), 0o600); err != nil {
		t.Fatal(err)
	}
	_, src, err := config.LoadSource(path)
	if err != nil {
		t.Fatal(err)
	}
	placed := fieldErrors(t, src.Place(errors.Join(&config.FieldError{Path: "profiles.p.tools[1].command[0]", Msg: "m"})))
	if got := *placed[0]; got.File != path || got.Line != 6 || got.Column != 29 {
		t.Errorf("placed at %s:%d:%d, want %s:6:29", got.File, got.Line, got.Column, path)
	}
	if err := os.WriteFile(path, []byte("concurrency: x\n"+profile("")), 0o600); err != nil {
		t.Fatal(err)
	}
	_, err = config.Load(path)
	if fe := fieldErrors(t, err); len(fe) != 1 || fe[0].File != path {
		t.Errorf("Load: %v, want one problem in %s", err, path)
	}
}

// TestParseQuotesNoCredentials: a value in the wrong place is quoted back in the error, which
// the worker logs and check-config prints, so a URL's user information (a NATS password or
// token, docs/security.md) is redacted first, before the quote is shortened, in every message
// that quotes a value.
func TestParseQuotesNoCredentials(t *testing.T) {
	const pw, tok = "Hunter2Passw0rd", "tok3nValue99"
	tests := []struct {
		name string
		yaml string
	}{
		{"URL for a mapping", "nats: nats://boxcar:" + pw + "@nats.example:4222\n" + profile("")},
		{"long URL, cut before its host", "nats: nats://a-rather-long-user-name:" + pw + "@nats.example:4222\n" + profile("")},
		{"URL list for a mapping", "nats: nats://a:" + pw + "@n1:4222,nats://" + tok + "@n2:4222\n" + profile("")},
		{"token URL for a list", profile("tools: nats://" + tok + "@n1")},
		{"URL for an integer", "concurrency: https://u:" + pw + "@h\n" + profile("")},
		{"URL for a boolean", "store: {path_style: https://u:" + pw + "@h}\n" + profile("")},
		{"URL for a duration", "nats: {ack_wait: https://u:" + pw + "@h}\n" + profile("")},
		{"URL as a key", "nats: {? [nats://u:" + pw + "@h] : 1}\n" + profile("")},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := config.Parse([]byte(tt.yaml))
			if err == nil {
				t.Fatalf("Parse accepted\n%s", tt.yaml)
			}
			for _, secret := range []string{pw, tok} {
				if strings.Contains(err.Error(), secret) {
					t.Errorf("the error quotes a credential of the file: %v", err)
				}
			}
		})
	}
}

// TestParseQuotesWholeCharacters: a value quoted in an error is shortened to whole characters;
// it was cut at its 40th byte, inside a character, which the message then showed as \x escapes.
func TestParseQuotesWholeCharacters(t *testing.T) {
	_, err := config.Parse([]byte("nats: " + strings.Repeat("a", 39) + strings.Repeat("€", 10) + "\n" + profile("")))
	if err == nil {
		t.Fatal("Parse accepted a string for the nats mapping")
	}
	if msg := err.Error(); !strings.Contains(msg, strings.Repeat("a", 39)+"…") || strings.Contains(msg, `\x`) {
		t.Errorf("the error quotes %q; want the value's whole characters, then …", msg)
	}
}
