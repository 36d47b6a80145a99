package agent

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/boxcar-run/boxcar/internal/config"
	"github.com/boxcar-run/boxcar/internal/sandbox"
)

// captureBytes is how much of each stream the sandbox keeps for one command. The model gets
// max_output_bytes of it (head and tail); the transcript gets all of it.
const captureBytes = sandbox.DefaultMaxOutputBytes

// commandResult is the JSON object a command's result is, for the model and the transcript.
type commandResult struct {
	ExitCode        int    `json:"exit_code"`
	TimedOut        bool   `json:"timed_out"`
	Stdout          string `json:"stdout"`
	Stderr          string `json:"stderr"`
	StdoutTruncated bool   `json:"stdout_truncated"`
	StderrTruncated bool   `json:"stderr_truncated"`
	// Error is set when the command ran but the sandbox reports a problem with it, such as
	// the workdir passing its disk bound.
	Error string `json:"error,omitempty"`
}

// runner is what command tools and the shell share: where and how long commands run. The
// environment is the sandbox's own (it gives PATH, HOME and LANG; nothing of the host's).
type runner struct {
	sb        Sandbox
	timeout   time.Duration
	maxOutput int
}

// exec runs argv and shapes the result. A non-zero exit or a timeout is data for the model;
// only a command that could not run at all is a failure.
func (r runner) exec(ctx context.Context, argv []string) result {
	start := time.Now()
	res, err := r.sb.Exec(ctx, sandbox.ExecRequest{
		Argv:           argv,
		Timeout:        r.timeout,
		MaxOutputBytes: captureBytes,
	})
	var problem string
	switch {
	case errors.Is(err, sandbox.ErrSandboxLost):
		res := lostSandbox(err)
		res.argv = argv
		return res
	case errors.Is(err, sandbox.ErrDiskFull):
		// The command ran: its result still goes to the model, with the problem bounded as
		// every error is (the sandbox's words name the program, which may be 128 KiB).
		problem, _ = clip([]byte(err.Error()), maxErrorBytes)
	case err != nil:
		res := failure("failed: the command could not run: %s", execProblem(execFailure{ctx: ctx, err: err, took: time.Since(start), timeout: r.timeout}))
		res.argv, res.detail = argv, err
		return res
	}
	stdout, stdoutCut := clip(res.Stdout, r.maxOutput)
	stderr, stderrCut := clip(res.Stderr, r.maxOutput)
	model := commandResult{
		ExitCode:        res.ExitCode,
		TimedOut:        res.TimedOut,
		Stdout:          stdout,
		Stderr:          stderr,
		StdoutTruncated: stdoutCut || res.StdoutTruncated,
		StderrTruncated: stderrCut || res.StderrTruncated,
		Error:           problem,
	}
	full := commandResult{
		ExitCode:        res.ExitCode,
		TimedOut:        res.TimedOut,
		Stdout:          string(res.Stdout),
		Stderr:          string(res.Stderr),
		StdoutTruncated: res.StdoutTruncated,
		StderrTruncated: res.StderrTruncated,
		Error:           problem,
	}
	return result{
		model:        model,
		full:         full,
		exitCode:     res.ExitCode,
		timedOut:     res.TimedOut,
		truncated:    model.StdoutTruncated || model.StderrTruncated,
		err:          problem,
		argv:         argv,
		ran:          true,
		execDuration: res.Duration,
		stdout:       digestOf(res.Stdout),
		stderr:       digestOf(res.Stderr),
	}
}

// execFailure is a command the sandbox could not run: its error, the job's context it was
// run on, how long the sandbox took to fail it and the command's own timeout.
type execFailure struct {
	ctx     context.Context
	err     error
	took    time.Duration
	timeout time.Duration
}

// execProblems are what the model and the transcript are told of a command the sandbox could
// not run, by the failure's kind, first match wins; anything else is execSetUpFailed. The
// sandbox's own words go to the worker's log only (callTool): they speak of the host's side,
// bwrap's first line of stderr naming the image's and the worker's data dir's paths, a pod, the
// cluster's address. A deadline or a cancel is told by whose it was: the job's context says
// whether its time ran out or it was stopped; a deadline error once the command's timeout has
// passed, the job's context alive, is the command's own (a backend that ends it as an error, not
// as timed_out); any other is the sandbox's (a client's timeout), not the job's.
var execProblems = []struct {
	when  func(f execFailure) bool
	words string
}{
	{func(f execFailure) bool { return errors.Is(f.ctx.Err(), context.DeadlineExceeded) }, "the job's time ran out"},
	{func(f execFailure) bool { return f.ctx.Err() != nil }, "the job was stopped"},
	{func(f execFailure) bool {
		return errors.Is(f.err, context.DeadlineExceeded) && f.timeout > 0 && f.took >= f.timeout
	}, "the command's command_timeout passed before the sandbox could give its result"},
	{execErrIs(sandbox.ErrClosed), "the sandbox was closed"},
	{execErrIs(sandbox.ErrUnavailable), "the sandbox's backend is unavailable"},
}

func execErrIs(target error) func(execFailure) bool {
	return func(f execFailure) bool { return errors.Is(f.err, target) }
}

// execSetUpFailed is what the model is told of any other failure to run a command.
const execSetUpFailed = "the sandbox could not be set up for it (the worker's log says why)"

// execProblem is what the model is told of f, a command the sandbox could not run.
func execProblem(f execFailure) string {
	for _, p := range execProblems {
		if p.when(f) {
			return p.words
		}
	}
	return execSetUpFailed
}

// commandTool is a named command: a fixed argv template whose "{{name}}" elements are
// replaced whole by the arguments, never through a shell.
type commandTool struct {
	runner
	spec config.Tool
}

func (t commandTool) Definition() definition {
	params := t.spec.Parameters
	if params == nil {
		params = objectParams(map[string]any{})
	}
	return definition{
		Name:        t.spec.Name,
		Description: or(t.spec.Description, "Run the "+t.spec.Name+" command."),
		Parameters:  params,
	}
}

func (t commandTool) Call(ctx context.Context, _ string, raw json.RawMessage) result {
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber() // 3 stays "3", 1e3 stays "1e3": no float formatting
	var args map[string]any
	if err := dec.Decode(&args); err != nil {
		return failure("invalid arguments: %v", err)
	}
	argv, err := substitute(t.spec.Command, args)
	if err != nil {
		return failure("invalid arguments: %v", err)
	}
	return t.exec(ctx, argv)
}

// substitute fills an argv template. An element "{{name}}" becomes the argument's value as one
// element, whatever characters it holds; an absent optional argument drops its element.
func substitute(template []string, args map[string]any) ([]string, error) {
	argv := make([]string, 0, len(template))
	for _, el := range template {
		name := placeholderName(el)
		if name == "" {
			argv = append(argv, el)
			continue
		}
		v, ok := args[name]
		if !ok {
			continue
		}
		s, err := argString(v)
		if err != nil {
			return nil, fmt.Errorf("parameter %q %w", name, err)
		}
		argv = append(argv, s)
	}
	return argv, nil
}

func argString(v any) (string, error) {
	switch v := v.(type) {
	case string:
		if strings.ContainsRune(v, 0) {
			return "", fmt.Errorf("contains a NUL byte")
		}
		return v, nil
	case json.Number:
		return v.String(), nil
	case bool:
		return strconv.FormatBool(v), nil
	default:
		return "", fmt.Errorf("must be a string, number or boolean to fill an argv element")
	}
}
