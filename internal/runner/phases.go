package runner

import (
	"maps"
	"time"

	"github.com/boxcar-run/boxcar/internal/agent"
	"github.com/boxcar-run/boxcar/internal/provenance"
	"github.com/boxcar-run/boxcar/internal/sandbox"
)

// phaseClock times an attempt's stages for its manifest's usage record: each lap is the wall
// time from the end of the stage before (or the attempt's start) to the end of this one.
type phaseClock struct {
	last time.Time
	ms   map[string]int64
}

// lap ends stage s now.
func (a *attempt) lap(s stage) {
	now := time.Now()
	if a.phases.ms == nil {
		a.phases.ms, a.phases.last = map[string]int64{}, a.began
	}
	a.phases.ms[s.String()] += now.Sub(a.phases.last).Milliseconds()
	a.phases.last = now
	a.at = s + 1
}

// phasesMS is the laps so far and, as stageCommit, the time since the last one: the manifest
// is written last, so its own write is the one thing the record leaves out.
func (a *attempt) phasesMS() map[string]int64 {
	out := maps.Clone(a.phases.ms)
	if out == nil {
		out = map[string]int64{}
	}
	last := a.phases.last
	if last.IsZero() {
		last = a.began
	}
	out[stageCommit.String()] += time.Since(last).Milliseconds()
	return out
}

// sandboxUsage reads what the sandbox's processes used, where the backend counts it
// (bubblewrap's per-sandbox cgroup), through any wrapper (a warm pool's); where it does not,
// the record names what is missing.
func sandboxUsage(sb sandbox.Sandbox) *provenance.SandboxUsage {
	c, ok := sandbox.As[sandbox.UsageCounter](sb)
	if !ok {
		return &provenance.SandboxUsage{Missing: []string{"cpu, memory: the " + sb.Info().Backend + " backend does not count them"}}
	}
	u, _ := c.Usage()
	return &provenance.SandboxUsage{CPUMS: u.CPUMillis, PeakMemoryBytes: u.PeakMemoryBytes, Source: u.Source, Missing: u.Missing}
}

// runUsage is the manifest's usage record of the attempt.
func runUsage(a *attempt, run ran) *provenance.RunUsage {
	u := &provenance.RunUsage{ModelCalls: []provenance.ModelCall{}, ToolCalls: len(run.result.ToolCalls), Sandbox: run.usage, PhasesMS: a.phasesMS()}
	for _, c := range run.result.Calls {
		u.ModelCalls = append(u.ModelCalls, modelCall(c))
	}
	return u
}

func modelCall(c agent.ModelCall) provenance.ModelCall {
	return provenance.ModelCall{Turn: c.Turn, ResponseID: c.ResponseID, PromptTokens: c.Usage.PromptTokens,
		CompletionTokens: c.Usage.CompletionTokens, TotalTokens: c.Usage.TotalTokens, TokensEstimated: c.Usage.Estimated,
		DurationMS: c.Duration.Milliseconds()}
}

// estimatedTokens is what of the calls' tokens the agent estimated, as their answers reported
// no usage.
func estimatedTokens(calls []agent.ModelCall) int64 {
	var n int64
	for _, c := range calls {
		if c.Usage.Estimated {
			n += c.Usage.TotalTokens
		}
	}
	return n
}
