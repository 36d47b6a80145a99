package agent_test

import (
	"bytes"
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/boxcar-run/boxcar/internal/agent"
	"github.com/boxcar-run/boxcar/internal/sandbox"
)

// failingSandbox fails every command with err.
type failingSandbox struct {
	*fakeSandbox
	err error
}

func (f failingSandbox) Exec(context.Context, sandbox.ExecRequest) (sandbox.ExecResult, error) {
	return sandbox.ExecResult{}, f.err
}

// TestExecFailureWordsForTheModel: a command the sandbox could not run is told to the model by
// the failure's kind, never in the sandbox's words, which speak of the host (bwrap's stderr
// with the worker's paths, the cluster's address); the worker's log keeps those with the job.
func TestExecFailureWordsForTheModel(t *testing.T) {
	const host = "/var/lib/boxcar/sandboxes/job-1/work"
	for _, tt := range []struct {
		name string
		err  error
		want string
	}{
		{"bwrap's set-up", fmt.Errorf("sandbox: exec echo: bubblewrap could not set up the sandbox: Can't find source path %s: No such file or directory", host),
			"the sandbox could not be set up for it"},
		{"a pod's exec", fmt.Errorf("sandbox: exec echo: error dialing backend: dial tcp %s 10.0.0.5:10250: connection refused", host), "the sandbox could not be set up for it"},
		{"closed", fmt.Errorf("sandbox %s: %w", host, sandbox.ErrClosed), "the sandbox was closed"},
		{"unavailable", fmt.Errorf("sandbox %s: %w", host, sandbox.ErrUnavailable), "the sandbox's backend is unavailable"},
		{"stopped", fmt.Errorf("sandbox: exec echo: killed %s: %w", host, context.Canceled), "the job was stopped"},
		{"out of time", fmt.Errorf("sandbox: exec echo: killed %s: %w", host, context.DeadlineExceeded), "the job's time ran out"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			s := newScript(t, toolCalls(100, call{"c1", "emit", `{"text": "x"}`}), final("done"))
			var logs bytes.Buffer
			req := request(csvProfile(t, emitTool), failingSandbox{newFakeSandbox(nil), tt.err})
			res, err := newAgent(t, s, func(c *agent.Config) { c.Logger = jsonLogger(&logs) }).Run(context.Background(), req)
			if err != nil {
				t.Fatalf("Run: %v", err)
			}
			got := lastToolResult(t, s.requests()[1])
			if !strings.HasPrefix(fmt.Sprint(got["error"]), "failed: the command could not run: "+tt.want) {
				t.Errorf("the model got %v; want %q", got, tt.want)
			}
			if strings.Contains(string(s.requests()[1].raw), host) || strings.Contains(string(res.Transcript), host) {
				t.Errorf("the model's request or the transcript names the host path")
			}
			if !strings.Contains(logs.String(), host) || !strings.Contains(logs.String(), req.JobID) {
				t.Errorf("the worker's log lacks the sandbox's words or the job's id:\n%s", logs.String())
			}
		})
	}
}
