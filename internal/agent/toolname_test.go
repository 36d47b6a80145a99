package agent_test

import (
	"bytes"
	"context"
	"encoding/json"
	"slices"
	"testing"

	"github.com/boxcar-run/boxcar/internal/agent"
)

// TestUndeclaredToolNamesStayInTheTranscript: a tool name the model makes up, escape sequences
// and all, never reaches a progress event or a tool call record (and so no status line, log
// label or metric label): those say agent.UnknownTool. The transcript keeps the name as sent,
// as escaped JSON data that a terminal showing it does not obey.
func TestUndeclaredToolNamesStayInTheTranscript(t *testing.T) {
	hostile := []string{
		"\x1b]0;pwned\x07\x1b[2J\x1b[Hjob succeeded", // retitle, clear the screen, forge a line
		"read_file\u202etxt.exe",                     // an RTL override
		"write_file\u200b",                           // a declared name plus a zero-width space
		"\u009b31mred",                               // a C1 control sequence introducer
	}
	calls := []call{{"c0", "read_file", `{"path":"sales.csv"}`}}
	for i, name := range hostile {
		calls = append(calls, call{id: "c" + string(rune('1'+i)), name: name, args: `{}`})
	}
	s := newScript(t, toolCalls(100, calls...), final("done"))
	req := request(csvProfile(t), newFakeSandbox(map[string]string{"sales.csv": "a\n1\n"}))
	var events []agent.Event
	req.Progress = func(e agent.Event) { events = append(events, e) }
	res, err := newAgent(t, s).Run(context.Background(), req)
	if err != nil {
		t.Fatalf("Run: %v", err)
	}

	var toolEvents []string
	for _, e := range events {
		if e.Kind == agent.EventToolCall {
			toolEvents = append(toolEvents, e.Tool)
		}
	}
	want := []string{"read_file", agent.UnknownTool, agent.UnknownTool, agent.UnknownTool, agent.UnknownTool}
	if !slices.Equal(toolEvents, want) {
		t.Errorf("progress event tools = %q, want %q", toolEvents, want)
	}
	var recorded []string
	for _, c := range res.ToolCalls {
		recorded = append(recorded, c.Tool)
	}
	if !slices.Equal(recorded, want) {
		t.Errorf("tool call records = %q, want %q", recorded, want)
	}

	for _, raw := range [][]byte{{0x1b}, {0x07}, []byte("\u202e"), []byte("\u200b"), []byte("\u009b")} {
		if bytes.Contains(res.Transcript, raw) {
			t.Errorf("the transcript holds %q unescaped", raw)
		}
	}
	var names []string
	for _, l := range transcriptLines(t, res.Transcript) {
		if l["type"] == "tool_call" {
			names = append(names, l["tool"].(string))
		}
	}
	if wantNames := append([]string{"read_file"}, hostile...); !slices.Equal(names, wantNames) {
		t.Errorf("transcript tool names = %q, want the names as sent %q", names, wantNames)
	}
	// The model is told which name it got wrong, quoted.
	ids, results := toolResults(t, s.requests()[1])
	for i, r := range results[1:] {
		msg, _ := json.Marshal(r["error"])
		if !bytes.Contains(msg, []byte("not found")) {
			t.Errorf("result of %s = %s, want a not-found error", ids[i+1], msg)
		}
	}
}
