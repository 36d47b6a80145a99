package runner_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/boxcar-run/boxcar/internal/agent"
	"github.com/boxcar-run/boxcar/internal/job"
	"github.com/boxcar-run/boxcar/internal/provenance"
)

// TestManifestRecordsWhatEachAttemptSpent: a first attempt spends 2 turns, 1 tool call and 100
// tokens, then its worker dies; the manifest the second attempt commits says what that
// attempt spent and what all attempts spent, so a cap hit early in it is explained by the
// manifest alone.
func TestManifestRecordsWhatEachAttemptSpent(t *testing.T) {
	t.Parallel()
	first := agent.Budget{Turns: 2, ToolCalls: 1, Tokens: 100}
	tests := []struct {
		name      string
		second    agentFunc
		wantState job.State
		wantThis  provenance.Budget
		wantAll   provenance.Budget
	}{
		{
			name: "second attempt capped by the first one's spending",
			second: func(ctx context.Context, req agent.Request) (agent.Result, error) {
				res, err := writeReport(ctx, req)
				res.Outcome, res.Cap = agent.OutcomeCapped, agent.CapMaxToolCalls
				res.Spent = req.Spent.Add(agent.Budget{Turns: 1, ToolCalls: 1, Tokens: 50})
				return res, err
			},
			wantState: job.StateCapped,
			wantThis:  provenance.Budget{Turns: 1, ToolCalls: 1, Tokens: 50},
			wantAll:   provenance.Budget{Turns: 3, ToolCalls: 2, Tokens: 150},
		},
		{
			// The agent returns an empty result when it refuses the request outright: this
			// attempt spent nothing, and all attempts what the first one did.
			name: "second attempt stopped before spending",
			second: func(ctx context.Context, req agent.Request) (agent.Result, error) {
				return agent.Result{}, fmt.Errorf("%w: the profile names no model", agent.ErrInvalidRequest)
			},
			wantState: job.StateFailed,
			wantThis:  provenance.Budget{},
			wantAll:   provenance.Budget{Turns: 2, ToolCalls: 1, Tokens: 100},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b := setup(t)
			j, _ := b.killedMidRun(func(req agent.Request) {
				req.Progress(agent.Event{Kind: agent.EventModelRequest, Turn: 1, MaxToolCalls: 30, Spent: agent.Budget{Turns: 1}})
				req.Progress(agent.Event{Kind: agent.EventToolCall, Turn: 1, ToolCalls: 1, MaxToolCalls: 30, Tool: "read_file", Spent: first})
			})

			b.worker(tt.second)
			st := b.waitFinal(j.ID, 20*time.Second)
			if st.State != tt.wantState || st.Attempt != 2 {
				t.Fatalf("status = %+v, want %s in attempt 2", st, tt.wantState)
			}
			m := b.manifest(j.ID).Predicate
			want := provenance.Spent{ThisAttempt: tt.wantThis, AllAttempts: tt.wantAll}
			if m.Spent != want || m.Attempt != 2 {
				t.Errorf("manifest spent = %+v in attempt %d, want %+v in attempt 2", m.Spent, m.Attempt, want)
			}
			// The job's status counts the same.
			if got := (provenance.Budget{Turns: st.SpentTurns, ToolCalls: st.SpentToolCalls, Tokens: st.SpentTokens}); got != tt.wantAll {
				t.Errorf("status spent = %+v, want %+v like the manifest", got, tt.wantAll)
			}
		})
	}
}
