package agent_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/boxcar-run/boxcar/internal/agent"
	"github.com/boxcar-run/boxcar/internal/config"
)

// TestTranscriptToolLines checks what the transcript keeps of each tool execution: the argv
// run or refused, the exit code, the durations, and the size and SHA-256 of each full output
// stream, so the record can be checked against what the sandbox produced.
func TestTranscriptToolLines(t *testing.T) {
	s := newScript(t,
		toolCalls(100,
			call{"c1", "print", `{"n": 100000}`},
			call{"c2", "emit", `{"text": "hi there"}`},
			call{"c3", "read_file", `{"path": "sales.csv"}`},
			call{"c4", "shell", `{"command": ["make", "test"]}`},
			call{"c5", "shell", `{"command": ["rm", "-rf", "/"]}`},
		),
		final("ok"))
	yes := approver(func(_ context.Context, r agent.ApprovalRequest) (agent.Answer, error) {
		time.Sleep(20 * time.Millisecond) // a person takes a moment
		return agent.Answer{Approved: r.Argv[0] == "make", By: "alice"}, nil
	})
	p := csvProfile(t, printTool, emitTool, config.Tool{Name: "shell", Kind: config.ToolShell, Policy: config.PolicyAsk})
	p.Limits.MaxOutputBytes = 1000
	req := request(p, newFakeSandbox(map[string]string{"sales.csv": salesCSV}))
	req.Approver = yes
	res, err := newAgent(t, s).Run(context.Background(), req)
	if err != nil {
		t.Fatalf("Run: %v", err)
	}
	lines := map[string]map[string]any{}
	for _, l := range transcriptLines(t, res.Transcript) {
		if l["type"] == "tool_call" {
			lines[l["id"].(string)] = l
		}
	}
	digest := func(s string) map[string]any {
		sum := sha256.Sum256([]byte(s))
		return map[string]any{"bytes": float64(len(s)), "sha256": hex.EncodeToString(sum[:])}
	}
	printed := "BEGIN" + strings.Repeat("x", 100000-8) + "END"
	tests := []struct {
		id         string
		wantArgv   []any
		wantExit   float64
		ran        bool
		wantStdout string
		truncated  bool
		asked      bool
		wantError  string
	}{
		{id: "c1", wantArgv: []any{"print", "100000"}, ran: true, wantStdout: printed, truncated: true},
		{id: "c2", wantArgv: []any{"echo", "hi there"}, ran: true, wantStdout: "hi there\n"},
		{id: "c3"},
		{id: "c4", wantArgv: []any{"make", "test"}, wantExit: 127, ran: true, asked: true},
		{id: "c5", wantArgv: []any{"rm", "-rf", "/"}, wantExit: -1, asked: true, wantError: "refused: a person denied the command"},
	}
	for _, tt := range tests {
		t.Run(tt.id, func(t *testing.T) {
			l := lines[tt.id]
			if l == nil {
				t.Fatal("no transcript line")
			}
			argv, _ := l["argv"].([]any)
			if !reflect.DeepEqual(argv, tt.wantArgv) {
				t.Errorf("argv = %v, want %v", argv, tt.wantArgv)
			}
			if l["exit_code"] != tt.wantExit || l["truncated"] != tt.truncated || l["timed_out"] != false {
				t.Errorf("exit_code %v truncated %v timed_out %v; want %v, %v, false", l["exit_code"], l["truncated"], l["timed_out"], tt.wantExit, tt.truncated)
			}
			if _, ok := l["duration_ms"].(float64); !ok {
				t.Errorf("duration_ms = %v, want a number", l["duration_ms"])
			}
			if msg, _ := l["error"].(string); msg != tt.wantError {
				t.Errorf("error = %q, want %q", msg, tt.wantError)
			}
			if wait, ok := l["approval_ms"].(float64); ok != tt.asked || (ok && wait < 20) {
				t.Errorf("approval_ms = %v, want it (at least 20) only for asked commands", l["approval_ms"])
			}
			_, hasExec := l["exec_ms"].(float64)
			if hasExec != tt.ran {
				t.Errorf("exec_ms = %v, want it only when a command ran", l["exec_ms"])
			}
			if !tt.ran {
				if l["stdout"] != nil || l["stderr"] != nil {
					t.Errorf("output digests %v %v for a call that ran no command", l["stdout"], l["stderr"])
				}
				return
			}
			if !reflect.DeepEqual(l["stdout"], digest(tt.wantStdout)) {
				t.Errorf("stdout digest = %v, want %v (the full output)", l["stdout"], digest(tt.wantStdout))
			}
			full, _ := l["result"].(map[string]any)
			stderr, _ := full["stderr"].(string)
			if !reflect.DeepEqual(l["stderr"], digest(stderr)) {
				t.Errorf("stderr digest = %v, want %v", l["stderr"], digest(stderr))
			}
		})
	}
}

// TestTranscriptBounded: the transcript keeps to MaxTranscriptBytes and ends with the
// truncation marker, whether the run keeps it in Result.Transcript or, with Request.Transcript,
// writes its lines to the writer as it goes (and Result.Transcript stays empty); a full
// transcript does not change the run.
func TestTranscriptBounded(t *testing.T) {
	for _, tt := range []struct {
		name     string
		toWriter bool
	}{
		{name: "in the result"},
		{name: "to a writer", toWriter: true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			s := newScript(t,
				toolCalls(100, call{"c1", "print", `{"n": 5000}`}),
				toolCalls(100, call{"c2", "print", `{"n": 5000}`}),
				final("ok"))
			p := csvProfile(t, printTool)
			p.Limits.MaxTranscriptBytes = 8192
			req := request(p, newFakeSandbox(nil))
			var spool bytes.Buffer
			if tt.toWriter {
				req.Transcript = &spool
			}
			res, err := newAgent(t, s).Run(context.Background(), req)
			if err != nil {
				t.Fatalf("Run: %v", err)
			}
			transcript := res.Transcript
			if tt.toWriter {
				if res.Transcript != nil {
					t.Errorf("Result.Transcript holds %d bytes; with a writer it must stay empty", len(res.Transcript))
				}
				transcript = spool.Bytes()
			}
			if len(transcript) > 8192 {
				t.Errorf("transcript is %d bytes, limit 8192", len(transcript))
			}
			lines := transcriptLines(t, transcript)
			if first := lines[0]; first["type"] != "request" {
				t.Errorf("first line = %v, want the request", first)
			}
			last := lines[len(lines)-1]
			if dropped, _ := last["dropped_lines"].(float64); last["type"] != "truncated" || dropped < 1 {
				t.Errorf("last line = %v, want the truncation marker", last)
			}
			if res.Outcome != agent.OutcomeCompleted {
				t.Errorf("outcome = %q: a full transcript must not change the run", res.Outcome)
			}
		})
	}
}

// failAfter is a transcript writer that takes n writes and then fails every write.
type failAfter struct {
	bytes.Buffer
	n, writes int
}

func (f *failAfter) Write(p []byte) (int, error) {
	f.writes++
	if f.writes > f.n {
		return 0, errors.New("disk full")
	}
	return f.Buffer.Write(p)
}

// TestTranscriptWriterFails: a transcript writer that fails gets nothing more (no line cut in
// two) and the run is not changed by it.
func TestTranscriptWriterFails(t *testing.T) {
	s := newScript(t, toolCalls(100, call{"c1", "print", `{"n": 50}`}), final("ok"))
	broken := &failAfter{n: 2}
	req := request(csvProfile(t, printTool), newFakeSandbox(nil))
	req.Transcript = broken
	res, err := newAgent(t, s).Run(context.Background(), req)
	if err != nil || res.Outcome != agent.OutcomeCompleted {
		t.Fatalf("Run with a failing transcript writer = %q, %v; want it completed", res.Outcome, err)
	}
	if lines := transcriptLines(t, broken.Bytes()); len(lines) != 2 || broken.writes != 3 {
		t.Errorf("the failing writer got %d lines and %d writes; want the 2 it took and no write after the one that failed", len(lines), broken.writes)
	}
}
