package config_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/boxcar-run/boxcar/internal/config"
)

// TestComplete: a profile as Load returns it is complete; one field left unset is named, so a
// caller that built a profile by hand learns which default it skipped.
func TestComplete(t *testing.T) {
	full := config.Profile{Tools: []config.Tool{{Name: "shell"}, {Name: "read_file"}}}.WithDefaults()
	tests := []struct {
		name string
		edit func(*config.Profile)
		want string // the unset field named; "" for complete
	}{
		{name: "defaults applied", edit: func(*config.Profile) {}},
		{name: "image and runtime class have no default", edit: func(p *config.Profile) { p.Sandbox.Image, p.Sandbox.RuntimeClass = "", "" }},
		{name: "workdir", edit: func(p *config.Profile) { p.Sandbox.Workdir = "" }, want: "sandbox.workdir"},
		{name: "cpu", edit: func(p *config.Profile) { p.Sandbox.CPU = "" }, want: "sandbox.cpu"},
		{name: "memory", edit: func(p *config.Profile) { p.Sandbox.Memory = "" }, want: "sandbox.memory"},
		{name: "disk", edit: func(p *config.Profile) { p.Sandbox.Disk = "" }, want: "sandbox.disk"},
		{name: "pids", edit: func(p *config.Profile) { p.Sandbox.PIDs = 0 }, want: "sandbox.pids"},
		{name: "lifetime", edit: func(p *config.Profile) { p.Sandbox.Lifetime = 0 }, want: "sandbox.lifetime"},
		{name: "max turns", edit: func(p *config.Profile) { p.Limits.MaxTurns = 0 }, want: "limits.max_turns"},
		{name: "max tool calls", edit: func(p *config.Profile) { p.Limits.MaxToolCalls = 0 }, want: "limits.max_tool_calls"},
		{name: "max tokens", edit: func(p *config.Profile) { p.Limits.MaxTokens = 0 }, want: "limits.max_tokens"},
		{name: "command timeout", edit: func(p *config.Profile) { p.Limits.CommandTimeout = 0 }, want: "limits.command_timeout"},
		{name: "max output bytes", edit: func(p *config.Profile) { p.Limits.MaxOutputBytes = 0 }, want: "limits.max_output_bytes"},
		{name: "job timeout", edit: func(p *config.Profile) { p.Limits.JobTimeout = 0 }, want: "limits.job_timeout"},
		{name: "approval timeout", edit: func(p *config.Profile) { p.Limits.ApprovalTimeout = 0 }, want: "limits.approval_timeout"},
		{name: "max transcript bytes", edit: func(p *config.Profile) { p.Limits.MaxTranscriptBytes = 0 }, want: "limits.max_transcript_bytes"},
		{name: "max conversation bytes", edit: func(p *config.Profile) { p.Limits.MaxConversationBytes = 0 }, want: "limits.max_conversation_bytes"},
		{name: "report", edit: func(p *config.Profile) { p.Report = "" }, want: "report"},
		{name: "artifacts", edit: func(p *config.Profile) { p.Artifacts = "" }, want: "artifacts"},
		{name: "tool kind", edit: func(p *config.Profile) { p.Tools[1].Kind = "" }, want: "tools[1].kind"},
		{name: "shell policy", edit: func(p *config.Profile) { p.Tools[0].Policy = "" }, want: "tools[0].policy"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := full
			p.Tools = append([]config.Tool(nil), full.Tools...)
			tt.edit(&p)
			err := p.Complete()
			if tt.want == "" {
				if err != nil {
					t.Fatalf("Complete() = %v, want nil", err)
				}
				return
			}
			if !errors.Is(err, config.ErrIncomplete) || !strings.Contains(err.Error(), "["+tt.want+"]") {
				t.Fatalf("Complete() = %v, want ErrIncomplete naming only %s", err, tt.want)
			}
			if strings.HasPrefix(tt.want, "sandbox.") {
				if err := p.Sandbox.Complete(); !errors.Is(err, config.ErrIncomplete) || !strings.Contains(err.Error(), tt.want) {
					t.Errorf("Sandbox.Complete() = %v, want ErrIncomplete naming %s", err, tt.want)
				}
			}
		})
	}
	if err := (config.Profile{}).Complete(); !errors.Is(err, config.ErrIncomplete) || !strings.Contains(err.Error(), "sandbox.workdir sandbox.cpu") {
		t.Errorf("empty profile: Complete() = %v, want every default named", err)
	}
}
