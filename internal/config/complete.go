package config

import (
	"errors"
	"fmt"
)

// Complete reports every field of the profile still at its zero value where Load puts a
// default. The layers below the config (the agent, the sandbox backends) require complete
// profiles instead of defaulting again, so a default lives in one place: WithDefaults.
func (p Profile) Complete() error {
	var unset []string
	var inc *incompleteError
	if errors.As(p.Sandbox.Complete(), &inc) {
		unset = append(unset, inc.fields...)
	}
	l := p.Limits
	for _, f := range []struct {
		name string
		zero bool
	}{
		{"limits.max_turns", l.MaxTurns == 0},
		{"limits.max_tool_calls", l.MaxToolCalls == 0},
		{"limits.max_tokens", l.MaxTokens == 0},
		{"limits.command_timeout", l.CommandTimeout == 0},
		{"limits.max_output_bytes", l.MaxOutputBytes == 0},
		{"limits.job_timeout", l.JobTimeout == 0},
		{"limits.approval_timeout", l.ApprovalTimeout == 0},
		{"limits.max_transcript_bytes", l.MaxTranscriptBytes == 0},
		{"limits.max_conversation_bytes", l.MaxConversationBytes == 0},
		{"report", p.Report == ""},
		{"artifacts", p.Artifacts == ""},
	} {
		if f.zero {
			unset = append(unset, f.name)
		}
	}
	for i, t := range p.Tools {
		if t.Kind == "" {
			unset = append(unset, fmt.Sprintf("tools[%d].kind", i))
		}
		if t.Kind == ToolShell && t.Policy == "" {
			unset = append(unset, fmt.Sprintf("tools[%d].policy", i))
		}
	}
	if len(unset) == 0 {
		return nil
	}
	return &incompleteError{fields: unset}
}

// Complete reports every field of the sandbox spec still at its zero value where Load puts a
// default (Image and RuntimeClass have none).
func (s SandboxSpec) Complete() error {
	var unset []string
	for _, f := range []struct {
		name string
		zero bool
	}{
		{"sandbox.workdir", s.Workdir == ""},
		{"sandbox.cpu", s.CPU == ""},
		{"sandbox.memory", s.Memory == ""},
		{"sandbox.disk", s.Disk == ""},
		{"sandbox.pids", s.PIDs == 0},
		{"sandbox.lifetime", s.Lifetime == 0},
	} {
		if f.zero {
			unset = append(unset, f.name)
		}
	}
	if len(unset) == 0 {
		return nil
	}
	return &incompleteError{fields: unset}
}

type incompleteError struct{ fields []string }

func (e *incompleteError) Error() string {
	return fmt.Sprintf("%v: %v unset; take profiles from config.Load or Parse, or apply Profile.WithDefaults", ErrIncomplete, e.fields)
}

func (e *incompleteError) Is(target error) bool { return target == ErrIncomplete }
