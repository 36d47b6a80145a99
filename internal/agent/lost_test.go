package agent_test

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/boxcar-run/boxcar/internal/sandbox"
)

// lostFakeSandbox is a sandbox gone from outside: every call fails with ErrSandboxLost.
type lostFakeSandbox struct{ *fakeSandbox }

var errPodGone = fmt.Errorf(`sandbox: the sandbox's pod boxcar-x is gone (pod_deleted): %w`, sandbox.ErrSandboxLost)

func (lostFakeSandbox) Exec(context.Context, sandbox.ExecRequest) (sandbox.ExecResult, error) {
	return sandbox.ExecResult{}, errPodGone
}
func (lostFakeSandbox) ReadFile(context.Context, string, int64) ([]byte, error) {
	return nil, errPodGone
}
func (lostFakeSandbox) WriteFile(context.Context, string, []byte) error { return errPodGone }
func (lostFakeSandbox) List(context.Context, string) ([]sandbox.FileInfo, error) {
	return nil, errPodGone
}

// TestSandboxLostEndsTheRun: a tool call that finds the sandbox gone ends the run with the
// loss: the model is not asked to go on without its workdir (its answer would become the
// job's report), and the calls after it in the same response are not run.
func TestSandboxLostEndsTheRun(t *testing.T) {
	for _, tt := range []struct{ name, tool, args string }{
		{name: "a command", tool: "emit", args: `{"text": "x"}`},
		{name: "read_file", tool: "read_file", args: `{"path": "sales.csv"}`},
		{name: "write_file", tool: "write_file", args: `{"path": "report.md", "content": "x"}`},
		{name: "list_files", tool: "list_files", args: `{}`},
	} {
		t.Run(tt.name, func(t *testing.T) {
			s := newScript(t, toolCalls(100, call{"c1", tt.tool, tt.args}, call{"c2", "emit", `{"text": "y"}`}), final("done anyway"))
			res, err := newAgent(t, s).Run(context.Background(), request(csvProfile(t, emitTool), lostFakeSandbox{newFakeSandbox(nil)}))
			if !errors.Is(err, sandbox.ErrSandboxLost) {
				t.Fatalf("Run: %v; want ErrSandboxLost", err)
			}
			if n := len(s.requests()); n != 1 {
				t.Errorf("the model was asked %d times; want once, before the loss", n)
			}
			if res.FinalMessage != "" || len(res.ToolCalls) != 1 {
				t.Errorf("result %+v: want no final message and the one call that found the loss", res)
			}
		})
	}
}
