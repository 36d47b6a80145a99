package agent_test

import (
	"context"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/boxcar-run/boxcar/internal/config"
	"github.com/boxcar-run/boxcar/internal/job"
)

func TestArgvSubstitution(t *testing.T) {
	tests := []struct {
		name     string
		args     string
		wantArgv []string
	}{
		{name: "shell metacharacters", args: `{"text": "; rm -rf /"}`, wantArgv: []string{"echo", "; rm -rf /"}},
		{name: "command substitution", args: `{"text": "$(id)"}`, wantArgv: []string{"echo", "$(id)"}},
		{name: "backticks and pipes", args: "{\"text\": \"`reboot` | tee /x > /y && z\"}", wantArgv: []string{"echo", "`reboot` | tee /x > /y && z"}},
		{name: "a flag", args: `{"text": "--flag"}`, wantArgv: []string{"echo", "--flag"}},
		{name: "whitespace and newlines", args: `{"text": "a b\tc\nd"}`, wantArgv: []string{"echo", "a b\tc\nd"}},
		{name: "empty string", args: `{"text": ""}`, wantArgv: []string{"echo", ""}},
		{name: "number and bool", args: `{"text": "x", "n": 3, "flag": true}`, wantArgv: []string{"echo", "x", "3", "true"}},
		{name: "numbers keep their spelling", args: `{"text": "x", "n": 1.50, "flag": false}`, wantArgv: []string{"echo", "x", "1.50", "false"}},
		{name: "large number", args: `{"text": "x", "n": 1e21}`, wantArgv: []string{"echo", "x", "1e21"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := newScript(t, toolCalls(100, call{"c1", "emit", tt.args}), final("ok"))
			sb := newFakeSandbox(nil)
			res, err := newAgent(t, s).Run(context.Background(), request(csvProfile(t, emitTool), sb))
			if err != nil {
				t.Fatalf("Run: %v", err)
			}
			if res.ToolCalls[0].Error != "" {
				t.Fatalf("emit failed: %s", res.ToolCalls[0].Error)
			}
			argvs := sb.argvs()
			if len(argvs) != 1 || !reflect.DeepEqual(argvs[0], tt.wantArgv) {
				t.Errorf("argv = %q, want %q", argvs, tt.wantArgv)
			}
		})
	}
}

// TestCommandTimeout: a command runs for its tool's own timeout or else the profile's
// command_timeout, and never longer than the job's command_timeout, which a tool's own timeout
// does not override.
func TestCommandTimeout(t *testing.T) {
	const profile = time.Minute
	shell := config.Tool{Name: "shell", Kind: config.ToolShell, Policy: config.PolicyAllowlist, Allow: []string{"*"}}
	tests := []struct {
		name              string
		tool              config.Tool
		args              string
		own, job, wantRun time.Duration // own, job: 0 is unset
	}{
		{name: "the profile's", tool: emitTool, args: `{"text": "x"}`, wantRun: profile},
		{name: "the tool's own overrides the profile's", tool: emitTool, args: `{"text": "x"}`, own: time.Hour, wantRun: time.Hour},
		{name: "the job's tightens the profile's", tool: emitTool, args: `{"text": "x"}`, job: 2 * time.Second, wantRun: 2 * time.Second},
		{name: "the job's bounds the tool's own", tool: emitTool, args: `{"text": "x"}`, own: time.Hour, job: 2 * time.Second, wantRun: 2 * time.Second},
		{name: "the job's above the profile's bounds the tool's own", tool: emitTool, args: `{"text": "x"}`, own: time.Hour, job: 2 * time.Minute, wantRun: 2 * time.Minute},
		{name: "the job's leaves a shorter own", tool: emitTool, args: `{"text": "x"}`, own: 5 * time.Second, job: 30 * time.Second, wantRun: 5 * time.Second},
		{name: "the job's bounds the shell's own", tool: shell, args: `{"command": ["ls"]}`, own: time.Hour, job: 2 * time.Second, wantRun: 2 * time.Second},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tool := tt.tool
			tool.Timeout = config.Duration(tt.own)
			p := csvProfile(t, tool)
			p.Limits.CommandTimeout = config.Duration(profile)
			p.Limits = p.Limits.Tighten(&job.Limits{CommandTimeout: job.Duration(tt.job)}) // as the runner does
			s := newScript(t, toolCalls(100, call{"c1", tool.Name, tt.args}), final("ok"))
			sb := newFakeSandbox(nil)
			if _, err := newAgent(t, s).Run(context.Background(), request(p, sb)); err != nil {
				t.Fatalf("Run: %v", err)
			}
			if got := sb.timeouts(); len(got) != 1 || got[0] != tt.wantRun {
				t.Errorf("the command ran with the timeouts %v, want [%s]", got, tt.wantRun)
			}
		})
	}
}

func TestOutputTruncation(t *testing.T) {
	s := newScript(t, toolCalls(100, call{"c1", "print", `{"n": 100000}`}), final("ok"))
	p := csvProfile(t, printTool)
	p.Limits.MaxOutputBytes = 1000
	res, err := newAgent(t, s).Run(context.Background(), request(p, newFakeSandbox(nil)))
	if err != nil {
		t.Fatalf("Run: %v", err)
	}
	got := lastToolResult(t, s.requests()[1])
	stdout, _ := got["stdout"].(string)
	if len(stdout) > 1000 || !strings.HasPrefix(stdout, "BEGIN") || !strings.HasSuffix(stdout, "END") ||
		!strings.Contains(stdout, "\n…[") || !strings.Contains(stdout, " bytes cut]…\n") {
		t.Errorf("stdout to the model (%d bytes) = %.80q…, want head and tail within 1000 bytes around the marker", len(stdout), stdout)
	}
	if got["stdout_truncated"] != true || got["stderr_truncated"] != false {
		t.Errorf("flags = %v/%v, want stdout_truncated only", got["stdout_truncated"], got["stderr_truncated"])
	}
	if !res.ToolCalls[0].Truncated {
		t.Error("the tool call record is not flagged truncated")
	}
	for _, l := range transcriptLines(t, res.Transcript) {
		if l["type"] == "tool_call" {
			full := l["result"].(map[string]any)["stdout"].(string)
			if len(full) != 100000 {
				t.Errorf("transcript stdout = %d bytes, want the full 100000", len(full))
			}
		}
	}
}

func TestReadFilePaging(t *testing.T) {
	content := strings.Repeat("0123456789", 300) // 3000 bytes
	s := newScript(t,
		toolCalls(100, call{"r1", "read_file", `{"path": "big.txt"}`}),
		toolCalls(100, call{"r2", "read_file", `{"path": "big.txt", "offset": 2048}`}),
		toolCalls(100, call{"r3", "read_file", `{"path": "big.txt", "offset": 10, "limit": 5}`}),
		final("ok"))
	p := csvProfile(t)
	p.Limits.MaxOutputBytes = 1024
	_, err := newAgent(t, s).Run(context.Background(), request(p, newFakeSandbox(map[string]string{"big.txt": content})))
	if err != nil {
		t.Fatalf("Run: %v", err)
	}
	reqs := s.requests()
	tests := []struct {
		name          string
		got           map[string]any
		wantContent   string
		wantTruncated bool
	}{
		{name: "first page", got: lastToolResult(t, reqs[1]), wantContent: content[:1024], wantTruncated: true},
		{name: "last page", got: lastToolResult(t, reqs[2]), wantContent: content[2048:], wantTruncated: false},
		{name: "limit", got: lastToolResult(t, reqs[3]), wantContent: content[10:15], wantTruncated: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if tt.got["content"] != tt.wantContent || tt.got["truncated"] != tt.wantTruncated || tt.got["size"] != 3000.0 {
				t.Errorf("result = %v, want %d bytes, truncated %v, size 3000", tt.got, len(tt.wantContent), tt.wantTruncated)
			}
		})
	}
}
