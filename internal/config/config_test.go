package config_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/boxcar-run/boxcar/examples"
	"github.com/boxcar-run/boxcar/internal/config"
	"github.com/boxcar-run/boxcar/internal/job"
)

func TestExampleConfigParses(t *testing.T) {
	cfg, err := config.Parse(examples.Config)
	if err != nil {
		t.Fatalf("examples/boxcar.yaml: %v", err)
	}
	p, err := cfg.Profile("csv-analyst")
	if err != nil {
		t.Fatal(err)
	}
	if got := len(p.Tools); got != 4 {
		t.Errorf("csv-analyst has %d tools, want 4", got)
	}
	if p.Tools[3].Kind != config.ToolCommand {
		t.Errorf("csv_stats kind = %q, want command", p.Tools[3].Kind)
	}
	if _, err := cfg.Profile("nope"); !errors.Is(err, config.ErrUnknownProfile) {
		t.Errorf("unknown profile error = %v, want ErrUnknownProfile", err)
	}
}

// TestInvalidConfigNamesTheField: each mistake an operator can make in the worker config is
// refused with the field it is in, so the message says where to look.
func TestInvalidConfigNamesTheField(t *testing.T) {
	const profile = "profiles:\n  p:\n    model: {name: m}\n    tools: [{name: read_file}]\n"
	tests := []struct {
		name      string
		yaml      string
		wantField string
	}{
		{"unknown backend", "sandbox: {backend: docker}\n" + profile, "sandbox.backend"},
		{"pull policy", "sandbox: {backend: kubernetes, kubernetes: {image_pull_policy: sometimes}}\n" + profile, "sandbox.kubernetes.image_pull_policy"},
		{"instance not a label value", "sandbox: {backend: kubernetes, kubernetes: {instance: 'boxcar/prod'}}\n" + profile, "sandbox.kubernetes.instance"},
		{"pull secret not a name", "sandbox: {backend: kubernetes, kubernetes: {image_pull_secrets: [regcred, 'Reg Cred']}}\n" + profile, "sandbox.kubernetes.image_pull_secrets[1]"},
		{"network policy unknown", "sandbox: {backend: kubernetes, kubernetes: {network_policy: allow-all}}\n" + profile, "sandbox.kubernetes.network_policy"},
		{"no concurrency", "concurrency: -1\n" + profile, "concurrency"},
		{"no profiles", "concurrency: 1\n", "profiles"},
		{"no model", "profiles:\n  p:\n    tools: [{name: read_file}]\n", "profiles.p.model.name"},
		{"no tools", "profiles:\n  p:\n    model: {name: m}\n", "profiles.p.tools"},
		{"bad memory", "profiles:\n  p:\n    model: {name: m}\n    tools: [{name: read_file}]\n    sandbox: {memory: lots}\n", "profiles.p.sandbox.memory"},
		{"relative workdir", "profiles:\n  p:\n    model: {name: m}\n    tools: [{name: read_file}]\n    sandbox: {workdir: work}\n", "profiles.p.sandbox.workdir"},
		{"bad tool name", "profiles:\n  p:\n    model: {name: m}\n    tools: [{name: 'rm -rf'}]\n", "profiles.p.tools[0].name"},
		{"tool twice", "profiles:\n  p:\n    model: {name: m}\n    tools: [{name: read_file}, {name: read_file}]\n", "profiles.p.tools[1].name"},
		{"conversation cap too small", profile + "    limits: {max_conversation_bytes: 4096}\n", "profiles.p.limits.max_conversation_bytes"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) { wantInvalid(t, tt.yaml, tt.wantField) })
	}
	for _, policy := range []string{"Always", "IfNotPresent", "Never"} {
		yaml := "sandbox: {backend: kubernetes, kubernetes: {image_pull_policy: " + policy + "}}\n" + profile
		if _, err := config.Parse([]byte(yaml)); err != nil {
			t.Errorf("image_pull_policy %s: %v", policy, err)
		}
	}
}

// TestProfileNamesAJobCanName: the config takes exactly the profile names a job can give
// (job.Validate, and so `submit run --profile`): a profile no job can reach is refused at
// load, naming the profile, not started and granted to tenants.
func TestProfileNamesAJobCanName(t *testing.T) {
	t.Parallel()
	for _, name := range []string{"web research", "-dash", "analyse/csv", "análisis", strings.Repeat("p", 129), "csv-analyst", "v1.2_b", strings.Repeat("p", 128)} {
		t.Run(name[:min(len(name), 12)], func(t *testing.T) {
			t.Parallel()
			yaml := "profiles:\n  \"" + name + "\":\n    model: {name: m}\n    tools: [{name: read_file}]\n" +
				"tenants:\n  team-a: {profiles: [\"" + name + "\"]}\n"
			_, err := config.Parse([]byte(yaml))
			j := job.Job{Version: job.Version, ID: job.NewID(), Profile: name, Task: "t", SubmittedAt: time.Now()}
			jerr := j.Validate()
			if (err == nil) != (jerr == nil) {
				t.Errorf("profile %q: the config says %v, a job naming it %v", name, err, jerr)
			}
			if err != nil && !strings.Contains(err.Error(), "profiles."+name+": ") {
				t.Errorf("the error does not name profiles.%s: %v", name, err)
			}
		})
	}
}

// wantInvalid wants Parse of yaml to fail with ErrInvalid naming field, as "field:".
func wantInvalid(t *testing.T, yaml, field string) {
	t.Helper()
	_, err := config.Parse([]byte(yaml))
	if !errors.Is(err, config.ErrInvalid) {
		t.Fatalf("Parse: %v, want ErrInvalid", err)
	}
	if !strings.Contains(err.Error(), field+":") {
		t.Errorf("Parse: %v\nwant the field %s named", err, field)
	}
}
