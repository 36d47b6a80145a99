//go:build integration

package runner_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/boxcar-run/boxcar/internal/agent"
	"github.com/boxcar-run/boxcar/internal/job"
)

// TestUnfinishedRunsHaveAReportThatSaysSo: a run that ends capped, failed, cancelled or dead
// has a report.md that says how it ended, what was done, which cap, and that the transcript
// holds the rest, followed by what the job wrote; never a silent empty file.
func TestUnfinishedRunsHaveAReportThatSaysSo(t *testing.T) {
	t.Parallel()
	calls := []agent.ToolCall{{ID: "c1", Tool: "read_file"}, {ID: "c2", Tool: "read_file", ExitCode: -1, Error: "no such file"}}
	tests := []struct {
		name   string
		agent  func(started chan<- struct{}) agentFunc
		cancel bool
		state  job.State
		want   []string // what report.md says, in this order
	}{
		{
			name: "capped with nothing written",
			agent: func(chan<- struct{}) agentFunc {
				return func(ctx context.Context, req agent.Request) (agent.Result, error) {
					return agent.Result{Outcome: agent.OutcomeCapped, Cap: agent.CapMaxToolCalls, ToolCalls: calls,
						Spent: agent.Budget{Turns: 3, ToolCalls: 2, Tokens: 900}}, nil
				}
			},
			state: job.StateCapped,
			want: []string{"capped", "max_tool_calls, 30 tool calls", "3 model turns, 2 tool calls and 900 tokens",
				"read_file ×2 (1 failed, 0 timed out)", "transcript.jsonl", "Nothing: the job wrote no report.md"},
		},
		{
			name: "capped after writing part of a report",
			agent: func(chan<- struct{}) agentFunc {
				return func(ctx context.Context, req agent.Request) (agent.Result, error) {
					if err := req.Sandbox.WriteFile(ctx, "report.md", []byte("## half done\n")); err != nil {
						return agent.Result{}, err
					}
					return agent.Result{Outcome: agent.OutcomeCapped, Cap: agent.CapMaxTurns, Spent: agent.Budget{Turns: 20}}, nil
				}
			},
			state: job.StateCapped,
			want:  []string{"capped", "max_turns, 20 model turns", "transcript.jsonl", "the job's report file report.md", "## half done"},
		},
		{
			name: "capped by an answer cut at the model's length limit",
			agent: func(chan<- struct{}) agentFunc {
				return func(ctx context.Context, req agent.Request) (agent.Result, error) {
					return agent.Result{Outcome: agent.OutcomeCapped, Cap: agent.CapAnswerLength, FinalMessage: "The sales rose in",
						Spent: agent.Budget{Turns: 2, Tokens: 4000}}, nil
				}
			},
			state: job.StateCapped,
			want: []string{"capped", "answer_length: the model's last answer was cut at its length limit (the model's own limit)",
				"transcript.jsonl", "the model's final message", "The sales rose in"},
		},
		{
			name: "capped by the conversation's bytes",
			agent: func(chan<- struct{}) agentFunc {
				return func(ctx context.Context, req agent.Request) (agent.Result, error) {
					return agent.Result{Outcome: agent.OutcomeCapped, Cap: agent.CapMaxConversationBytes, Spent: agent.Budget{Turns: 3}}, nil
				}
			},
			state: job.StateCapped,
			want: []string{"capped", "max_conversation_bytes, 8388608 bytes of the model's answers and tool results in the attempt's conversation",
				"transcript.jsonl"},
		},
		{
			name: "failed",
			agent: func(chan<- struct{}) agentFunc {
				return func(ctx context.Context, req agent.Request) (agent.Result, error) {
					return agent.Result{FinalMessage: "I could not"}, fmt.Errorf("%w: 401 invalid key", agent.ErrModelAuth)
				}
			},
			state: job.StateFailed,
			want:  []string{"failed", "model_rejected", "401 invalid key", "transcript.jsonl", "the model's final message", "I could not"},
		},
		{
			name: "dead after every delivery failed",
			agent: func(chan<- struct{}) agentFunc {
				return func(ctx context.Context, req agent.Request) (agent.Result, error) {
					return agent.Result{Spent: agent.Budget{Turns: 1}}, fmt.Errorf("%w: 503 from the model", agent.ErrModelUnavailable)
				}
			},
			state: job.StateDead,
			want:  []string{"dead", "after attempt 3", "503 from the model", "transcript.jsonl", "Nothing"},
		},
		{
			name: "cancelled while running",
			agent: func(started chan<- struct{}) agentFunc {
				return func(ctx context.Context, req agent.Request) (agent.Result, error) {
					if err := req.Sandbox.WriteFile(ctx, "report.md", []byte("partial findings")); err != nil {
						return agent.Result{}, err
					}
					started <- struct{}{}
					<-ctx.Done()
					return agent.Result{}, ctx.Err()
				}
			},
			cancel: true,
			state:  job.StateCancelled,
			want:   []string{"cancelled", "what it had done until then", "transcript.jsonl", "partial findings"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b := setup(t)
			started := make(chan struct{}, 1)
			b.worker(tt.agent(started), withBubblewrap(t))
			j := b.submit("p")
			if tt.cancel {
				select {
				case <-started:
				case <-time.After(time.Minute):
					t.Fatal("the job did not start within a minute")
				}
				if _, err := b.q.Cancel(context.Background(), j.ID, "tester"); err != nil {
					t.Fatal(err)
				}
			}
			st := b.waitFinal(j.ID, time.Minute)
			if st.State != tt.state || st.Report == "" {
				t.Fatalf("status = %+v, want %s with a report", st, tt.state)
			}
			report := string(b.runFile(j.ID, "report.md"))
			rest := report
			for _, w := range tt.want {
				i := strings.Index(rest, w)
				if i < 0 {
					t.Fatalf("report.md does not say %q (after what came before):\n%s", w, report)
				}
				rest = rest[i+len(w):]
			}
			if m := b.manifest(j.ID); m.Predicate.Collected.Report != "summary" {
				t.Errorf("manifest collected = %+v, want report from the worker's summary", m.Predicate.Collected)
			}
		})
	}
}
