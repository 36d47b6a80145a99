package runner

import (
	"context"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/boxcar-run/boxcar/internal/agent"
	"github.com/boxcar-run/boxcar/internal/metrics"
	"github.com/boxcar-run/boxcar/internal/sandbox"
)

// timedSandbox times every command the agent's tools run, for boxcar_sandbox_exec_seconds.
type timedSandbox struct {
	sandbox.Sandbox
	exec prometheus.Observer
}

func (r *Runner) timed(sb sandbox.Sandbox) sandbox.Sandbox {
	return timedSandbox{Sandbox: sb, exec: r.m.SandboxExec.WithLabelValues(r.cfg.Sandboxes.Backend())}
}

// Unwrap returns the sandbox beneath, for sandbox.As.
func (s timedSandbox) Unwrap() sandbox.Sandbox { return s.Sandbox }

func (s timedSandbox) Exec(ctx context.Context, req sandbox.ExecRequest) (sandbox.ExecResult, error) {
	start := time.Now()
	res, err := s.Sandbox.Exec(ctx, req)
	s.exec.Observe(time.Since(start).Seconds())
	return res, err
}

// recordToolCalls counts the attempt's tool calls by tool and outcome. The agent already records
// a name the profile does not declare (a model inventing tools) as agent.UnknownTool, so the
// label stays bounded.
func (r *Runner) recordToolCalls(a *attempt, res agent.Result) {
	for _, c := range res.ToolCalls {
		r.m.ToolCalls.WithLabelValues(a.job.Profile, c.Tool, metrics.ToolOutcome(c.ExitCode, c.TimedOut, c.Error)).Inc()
	}
}
