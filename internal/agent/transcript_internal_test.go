package agent

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"slices"
	"strings"
	"testing"
)

func TestShrinkLine(t *testing.T) {
	big := strings.Repeat("a", 1<<20)
	tests := []struct {
		name      string
		line      map[string]any
		wantKeys  []string // besides "shrunk"
		wantStub  bool
		wantShort string // a field whose string must now be short
	}{
		{
			name:      "long strings are cut",
			line:      map[string]any{"type": "tool_call", "turn": 1, "id": "c1", "args": map[string]any{"path": big}, "error": "failed"},
			wantKeys:  []string{"type", "turn", "id", "args", "error"},
			wantShort: "args",
		},
		{
			name:     "still too long: only what identifies the event",
			line:     map[string]any{"type": "tool_call", "turn": 2, "id": "c2", "tool": "emit", "exit_code": -1, "error": "invalid arguments", "args": map[string]any{"n": make([]int, 200000)}},
			wantKeys: []string{"type", "turn", "id", "tool", "exit_code", "error"},
			wantStub: true,
		},
		{
			// Shrinking marshals the line anew, which must not undo escapeInvisible.
			name:      "invisible characters stay escaped",
			line:      map[string]any{"type": "tool_call", "turn": 3, "id": "c3", "tool": "\u009b2J\u009bHjob succeeded\u202eexe.txt", "args": map[string]any{"path": big + "\u2066"}},
			wantKeys:  []string{"type", "turn", "id", "tool", "args"},
			wantShort: "args",
		},
		{
			// 54 KB as it comes, 102 KB with its escapes: measured escaped, it is too long.
			name:     "escapes that pass the limit: only what identifies the event",
			line:     map[string]any{"type": "tool_call", "turn": 4, "id": "c4", "tool": "\u202eemit", "args": map[string]any{"n": slices.Repeat([]string{strings.Repeat("\u200b", 8)}, 2000)}},
			wantKeys: []string{"type", "turn", "id", "tool"},
			wantStub: true,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			line, err := json.Marshal(tt.line)
			if err != nil {
				t.Fatal(err)
			}
			const limit = 64 << 10
			out := shrinkLine(line, limit)
			if len(out) > limit {
				t.Fatalf("shrunk line is %d bytes, limit %d", len(out), limit)
			}
			if i := bytes.IndexFunc(out, invisible); i >= 0 {
				t.Errorf("shrunk line holds %q unescaped at byte %d", []rune(string(out[i:]))[0], i)
			}
			var got map[string]any
			if err := json.Unmarshal(out, &got); err != nil {
				t.Fatal(err)
			}
			sum := sha256.Sum256(line)
			info, _ := got["shrunk"].(map[string]any)
			if info["bytes"] != float64(len(line)) || info["sha256"] != hex.EncodeToString(sum[:]) {
				t.Errorf("shrunk = %v, want the original's size and digest", info)
			}
			for _, k := range tt.wantKeys {
				if _, ok := got[k]; !ok {
					t.Errorf("key %q lost", k)
				}
			}
			if _, hasArgs := got["args"]; tt.wantStub == hasArgs {
				t.Errorf("args kept: %v, want %v", hasArgs, !tt.wantStub)
			}
			if tt.wantShort != "" {
				if b, _ := json.Marshal(got[tt.wantShort]); len(b) > shrinkString+100 || !strings.Contains(string(b), "bytes cut") {
					t.Errorf("%s = %d bytes, want it cut to about %d with the marker", tt.wantShort, len(b), shrinkString)
				}
			}
			if got["turn"] != float64(tt.line["turn"].(int)) || got["id"] != tt.line["id"] {
				t.Errorf("turn %v id %v, want them kept", got["turn"], got["id"])
			}
		})
	}
}
