package agent_test

import (
	"context"
	"reflect"
	"strings"
	"testing"
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
