package agent_test

import (
	"bytes"
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/boxcar-run/boxcar/internal/agent"
	"github.com/boxcar-run/boxcar/internal/config"
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
		// A deadline or a cancel of the sandbox's own (a client's timeout, a pool that closed),
		// the job's context alive: neither the job's time nor the job stopped.
		{"a deadline of the sandbox's", fmt.Errorf("sandbox: exec echo: dial %s: %w", host, context.DeadlineExceeded), "the sandbox could not be set up for it"},
		{"a cancel of the sandbox's", fmt.Errorf("sandbox: exec echo: dial %s: %w", host, context.Canceled), "the sandbox could not be set up for it"},
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

// deadlineSandbox fails every command as a backend whose deadlines end it with the context's
// error: the command's own (its timeout passed), or the job's (job), or the job stopped (stop).
type deadlineSandbox struct {
	*fakeSandbox
	job  bool
	stop context.CancelFunc
}

func (d deadlineSandbox) Exec(ctx context.Context, req sandbox.ExecRequest) (sandbox.ExecResult, error) {
	switch {
	case d.stop != nil:
		d.stop()
	case !d.job:
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, req.Timeout)
		defer cancel()
	}
	<-ctx.Done()
	return sandbox.ExecResult{}, fmt.Errorf("sandbox: exec %s: killed: %w", req.Argv[0], ctx.Err())
}

// TestExecDeadlineWordsForTheModel: a command the sandbox ended with a deadline error is told
// as the deadline that passed: the command's own command_timeout, or the job's job_timeout; a
// job stopped is told so. Any deadline error was "the job's time ran out", the command's own
// timeout too, the job going on with the model told its time was up.
func TestExecDeadlineWordsForTheModel(t *testing.T) {
	for _, tt := range []struct {
		name string
		sb   func(stop context.CancelFunc) deadlineSandbox
		want string
	}{
		{"the command's timeout", func(context.CancelFunc) deadlineSandbox { return deadlineSandbox{fakeSandbox: newFakeSandbox(nil)} },
			"the command's command_timeout passed"},
		{"the job's timeout", func(context.CancelFunc) deadlineSandbox {
			return deadlineSandbox{fakeSandbox: newFakeSandbox(nil), job: true}
		},
			"the job's time ran out"},
		{"the job stopped", func(stop context.CancelFunc) deadlineSandbox {
			return deadlineSandbox{fakeSandbox: newFakeSandbox(nil), stop: stop}
		}, "the job was stopped"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			s := newScript(t, toolCalls(100, call{"c1", "emit", `{"text": "x"}`}), final("done"))
			p := csvProfile(t, emitTool)
			p.Limits.CommandTimeout = config.Duration(50 * time.Millisecond)
			p.Limits.JobTimeout = config.Duration(time.Minute)
			if tt.name == "the job's timeout" {
				p.Limits.CommandTimeout, p.Limits.JobTimeout = config.Duration(time.Minute), config.Duration(50*time.Millisecond)
			}
			ctx, stop := context.WithCancel(context.Background())
			defer stop()
			res, _ := newAgent(t, s).Run(ctx, request(p, tt.sb(stop)))
			if want := "failed: the command could not run: " + tt.want; !strings.Contains(string(res.Transcript), want) {
				t.Errorf("the transcript lacks %q:\n%s", want, res.Transcript)
			}
		})
	}
}
