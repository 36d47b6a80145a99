package agent_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/boxcar-run/boxcar/internal/sandbox"
)

// floodSandbox is a fake sandbox whose commands print the streams given and whose listing is the
// names given, on top of fakeSandbox's files: what hostile code in a sandbox can make a tool
// return.
type floodSandbox struct {
	*fakeSandbox
	stdout, stderr string
	names          []string
	execErr        error // what Exec returns with its result
}

func (f floodSandbox) Exec(ctx context.Context, req sandbox.ExecRequest) (sandbox.ExecResult, error) {
	if req.Argv[0] != "print" {
		return f.fakeSandbox.Exec(ctx, req)
	}
	return sandbox.ExecResult{Stdout: []byte(f.stdout), Stderr: []byte(f.stderr)}, f.execErr
}

func (f floodSandbox) List(ctx context.Context, dir string) ([]sandbox.FileInfo, error) {
	if f.names == nil {
		return f.fakeSandbox.List(ctx, dir)
	}
	out := make([]sandbox.FileInfo, len(f.names))
	for i, n := range f.names {
		out[i] = sandbox.FileInfo{Path: n, Size: 1}
	}
	return out, nil
}

// TestOutputCapsCountWhatTheModelGets: max_output_bytes bounds what of a tool's output goes
// back to the model, and the 1 KiB of an error message likewise; the model gets them inside a
// JSON object, where a control byte, an invalid UTF-8 byte, '<', '>' and '&' take 6 bytes
// (\u0001, \ufffd, \u003c) and a newline, a quote or a backslash 2. Bounded in raw bytes, a
// command printing 1 MiB of \x01 and 1 MiB of '<' sent the model a result of 98,143 bytes under
// max_output_bytes 8192 (12 times it), a binary file read 49,241 bytes.
func TestOutputCapsCountWhatTheModelGets(t *testing.T) {
	const maxOutput = 8192
	const meg = 1 << 20
	names := make([]string, 2000)
	for i := range names {
		names[i] = fmt.Sprintf("%04d", i) + strings.Repeat("\x01", 200)
	}
	tests := []struct {
		name  string
		sb    floodSandbox
		call  call
		field string // the result's field the cap bounds; "" for the whole result
		most  int    // its most bytes as the model gets it, escapes included
	}{
		{name: "stdout of control bytes", sb: floodSandbox{stdout: strings.Repeat("\x01", meg)},
			call: call{"c1", "print", `{"n":1}`}, field: "stdout", most: maxOutput},
		{name: "stderr of angle brackets", sb: floodSandbox{stderr: strings.Repeat("<", meg)},
			call: call{"c1", "print", `{"n":1}`}, field: "stderr", most: maxOutput},
		{name: "stdout of invalid UTF-8", sb: floodSandbox{stdout: strings.Repeat("\xff", meg)},
			call: call{"c1", "print", `{"n":1}`}, field: "stdout", most: maxOutput},
		{name: "stdout of backslashes and newlines", sb: floodSandbox{stdout: strings.Repeat("\\\n", meg)},
			call: call{"c1", "print", `{"n":1}`}, field: "stdout", most: maxOutput},
		{name: "read_file of a binary file", sb: floodSandbox{},
			call: call{"c1", "read_file", `{"path":"bin"}`}, field: "content", most: maxOutput},
		{name: "list_files of names of control bytes", sb: floodSandbox{names: names},
			call: call{"c1", "list_files", `{}`}, most: maxOutput},
		// The sandbox names the program in its error: under an allowlist pattern "*", or a
		// person's approval, argv[0] may be 128 KiB. The error came whole.
		{name: "a disk-full error naming a long program", sb: floodSandbox{execErr: fmt.Errorf("sandbox: exec %s: the workdir is over its bound: %w",
			strings.Repeat("\x01", 128<<10), sandbox.ErrDiskFull)},
			call: call{"c1", "print", `{"n":1}`}, field: "error", most: 1024},
		{name: "an error quoting a path of control bytes", sb: floodSandbox{},
			call: call{"c1", "read_file", `{"path":"` + strings.Repeat(`\u0001`, 4000) + `"}`}, field: "error", most: 1024},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := newScript(t, toolCalls(100, tt.call), final("done"))
			p := csvProfile(t, printTool)
			p.Limits.MaxOutputBytes = maxOutput
			tt.sb.fakeSandbox = newFakeSandbox(map[string]string{"bin": strings.Repeat("\xff", meg)})
			if _, err := newAgent(t, s).Run(context.Background(), request(p, tt.sb)); err != nil {
				t.Fatalf("Run: %v", err)
			}
			var content string
			for _, m := range messages(t, s.requests()[1]) {
				if m["role"] == "tool" {
					content, _ = m["content"].(string)
				}
			}
			got := len(content)
			if tt.field != "" {
				var res map[string]json.RawMessage
				if err := json.Unmarshal([]byte(content), &res); err != nil {
					t.Fatalf("result %.80q: %v", content, err)
				}
				got = len(res[tt.field]) - 2 // its quotes aside
			}
			if got > tt.most || got < tt.most/2 {
				t.Errorf("%s of the result is %d bytes as the model gets it; want at most %d, and most of it used",
					or(tt.field, "the whole"), got, tt.most)
			}
		})
	}
}
