package runner

import (
	"context"
	"errors"
	"fmt"

	"github.com/boxcar-run/boxcar/internal/agent"
	"github.com/boxcar-run/boxcar/internal/job"
	"github.com/boxcar-run/boxcar/internal/queue"
)

// budget keeps a job's spent budget (turns, tool calls, tokens) in its status: what earlier
// attempts used, read when this attempt started, plus what this attempt adds. It is written
// with every progress event of the agent, and each event counts the request or call it
// announces, so a worker that dies in the middle of a run still leaves its spending behind:
// the next attempt starts from it, never from zero.
//
// Writes add what is new since the last write (under the status bucket's compare-and-set), so
// two attempts that overlap, a stale one and its successor, both count. The one write that
// takes something back is the agent's: a turn whose request found the endpoint unavailable
// (agent.EventModelUnavailable) is no turn, and the status then says what the agent counts.
type budget struct {
	r        *Runner
	a        *attempt
	base     agent.Budget // spent by earlier attempts when this one started
	recorded agent.Budget // spent as far as this attempt has written it
	// claim goes into the status with every write: `submit status` shows when the attempt had
	// its sandbox, at no write of its own.
	claim *claimed
}

func (r *Runner) newBudget(a *attempt, st job.Status) *budget {
	base := agent.Budget{Turns: st.SpentTurns, ToolCalls: st.SpentToolCalls, Tokens: st.SpentTokens}
	return &budget{r: r, a: a, base: base, recorded: base}
}

// progress records one agent event: the progress line `submit watch` shows, and the spent
// budget. The agent calls it synchronously, so it needs no lock.
func (b *budget) progress(ctx context.Context, e agent.Event) {
	var msg string
	switch e.Kind {
	case agent.EventToolCall:
		msg = fmt.Sprintf("tool call %d of %d: %s", e.Spent.ToolCalls, e.MaxToolCalls, e.Tool)
	case agent.EventModelUnavailable:
		msg = fmt.Sprintf("model turn %d of %d: the model endpoint is unavailable", e.Spent.Turns+1, b.a.limits.MaxTurns)
	default:
		msg = fmt.Sprintf("model turn %d of %d", e.Spent.Turns, b.a.limits.MaxTurns)
	}
	b.record(ctx, e.Spent, msg)
}

// finish records what the run spent in the end (the tokens of its last answer, typically),
// with msg as the progress line when msg is set, and reports whether it wrote. It runs on a
// context that survives the job's end: an interrupted attempt must leave its spending behind.
func (b *budget) finish(ctx context.Context, spent agent.Budget, msg string) bool {
	// Only adds: a run that ended without counting (the agent panicked) leaves what its
	// events recorded.
	r := b.recorded
	spent = agent.Budget{Turns: max(spent.Turns, r.Turns), ToolCalls: max(spent.ToolCalls, r.ToolCalls), Tokens: max(spent.Tokens, r.Tokens)}
	if spent == r {
		return false // nothing new
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), b.r.cfg.CleanupTimeout)
	defer cancel()
	return b.record(ctx, spent, msg)
}

// record writes spent and msg (when set) to the job's status and reports whether it did. It
// adds the difference to what this attempt recorded before, which is less than nothing only
// for a turn the agent took back.
func (b *budget) record(ctx context.Context, spent agent.Budget, msg string) bool {
	add := agent.Budget{
		Turns:     spent.Turns - b.recorded.Turns,
		ToolCalls: spent.ToolCalls - b.recorded.ToolCalls,
		Tokens:    spent.Tokens - b.recorded.Tokens,
	}
	_, err := b.r.writeStatus(ctx, b.a, b.a.job.ID, func(s *job.Status) {
		s.SpentTurns = max(s.SpentTurns+add.Turns, 0)
		s.SpentToolCalls = max(s.SpentToolCalls+add.ToolCalls, 0)
		s.SpentTokens = max(s.SpentTokens+add.Tokens, 0)
		s.ToolCalls = s.SpentToolCalls
		if b.claim != nil {
			s.SandboxClaimedAt, s.SandboxWarm = b.claim.at.UTC(), b.claim.warm
		}
		if msg != "" {
			s.Progress = msg
		}
	})
	switch {
	case err == nil:
		b.recorded = spent
		return true
	case errors.Is(err, queue.ErrFinal), errors.Is(err, errLeaseLost), ctx.Err() != nil:
	default:
		// The next write adds what this one could not.
		b.a.log.WarnContext(ctx, "record progress failed", "error", err)
	}
	return false
}
