package agent_test

import (
	"context"
	"errors"
	"fmt"
	"math"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/boxcar-run/boxcar/internal/agent"
	"github.com/boxcar-run/boxcar/internal/config"
)

// TestCapsExactlyAtTheLimit runs each cap right at its boundary: a cap of N allows exactly N
// (turns, tool calls executed, tokens before the next request), never one more, and a run
// that stops on its own exactly at the cap is completed, not capped.
func TestCapsExactlyAtTheLimit(t *testing.T) {
	emit := func(id string) call { return call{id, "emit", `{"text":"` + id + `"}`} }
	tests := []struct {
		name      string
		limits    func(*config.Limits)
		spent     agent.Budget
		replies   []reply
		wantCap   string // "" means completed
		wantExecs []string
		wantReqs  int
		wantSpent agent.Budget
		wantSkip  string // the start of the answer to calls that did not run
	}{
		{
			name:      "max_tool_calls 3 across two responses runs exactly 3",
			limits:    func(l *config.Limits) { l.MaxToolCalls = 3 },
			replies:   []reply{toolCalls(1000, emit("a"), emit("b")), toolCalls(1000, emit("c"), emit("d"))},
			wantCap:   agent.CapMaxToolCalls,
			wantExecs: []string{"a", "b", "c"},
			wantReqs:  2,
			wantSpent: agent.Budget{Turns: 2, ToolCalls: 3, Tokens: 2000},
			wantSkip:  "not run: the job reached its cap of 3 tool calls",
		},
		{
			name:      "max_tool_calls 3 reached then the model stops: completed",
			limits:    func(l *config.Limits) { l.MaxToolCalls = 3 },
			replies:   []reply{toolCalls(1000, emit("a"), emit("b"), emit("c")), final("done")},
			wantExecs: []string{"a", "b", "c"},
			wantReqs:  2,
			wantSpent: agent.Budget{Turns: 2, ToolCalls: 3, Tokens: 1500},
		},
		{
			name:      "max_tool_calls 3 reached then one more call: capped",
			limits:    func(l *config.Limits) { l.MaxToolCalls = 3 },
			replies:   []reply{toolCalls(1000, emit("a"), emit("b"), emit("c")), toolCalls(1000, emit("d"))},
			wantCap:   agent.CapMaxToolCalls,
			wantExecs: []string{"a", "b", "c"},
			wantReqs:  2,
			wantSpent: agent.Budget{Turns: 2, ToolCalls: 3, Tokens: 2000},
			wantSkip:  "not run",
		},
		{
			name:      "max_tool_calls 1: an invalid call uses it up",
			limits:    func(l *config.Limits) { l.MaxToolCalls = 1 },
			replies:   []reply{toolCalls(1000, call{"x", "nope", `{}`}, emit("a"))},
			wantCap:   agent.CapMaxToolCalls,
			wantReqs:  1,
			wantSpent: agent.Budget{Turns: 1, ToolCalls: 1, Tokens: 1000},
			wantSkip:  "not run",
		},
		{
			name:      "max_turns 3 sends exactly 3 requests",
			limits:    func(l *config.Limits) { l.MaxTurns = 3 },
			replies:   []reply{toolCalls(1000, emit("a")), toolCalls(1000, emit("b")), toolCalls(1000, emit("c"))},
			wantCap:   agent.CapMaxTurns,
			wantExecs: []string{"a", "b", "c"},
			wantReqs:  3,
			wantSpent: agent.Budget{Turns: 3, ToolCalls: 3, Tokens: 3000},
		},
		{
			name:      "max_turns 3 with the answer on the third: completed",
			limits:    func(l *config.Limits) { l.MaxTurns = 3 },
			replies:   []reply{toolCalls(1000, emit("a")), toolCalls(1000, emit("b")), final("done")},
			wantExecs: []string{"a", "b"},
			wantReqs:  3,
			wantSpent: agent.Budget{Turns: 3, ToolCalls: 2, Tokens: 2500},
		},
		{
			name:      "max_tokens 1000 reached exactly: no further request",
			limits:    func(l *config.Limits) { l.MaxTokens = 10000 },
			replies:   []reply{toolCalls(5000, emit("a")), toolCalls(5000, emit("b"))},
			wantCap:   agent.CapMaxTokens,
			wantExecs: []string{"a", "b"},
			wantReqs:  2,
			wantSpent: agent.Budget{Turns: 2, ToolCalls: 2, Tokens: 10000},
		},
		{
			name:      "max_tokens 1000 with 999 used: one more request",
			limits:    func(l *config.Limits) { l.MaxTokens = 10000 },
			replies:   []reply{toolCalls(4990, emit("a")), toolCalls(5000, emit("b")), final("done")},
			wantExecs: []string{"a", "b"},
			wantReqs:  3,
			wantSpent: agent.Budget{Turns: 3, ToolCalls: 2, Tokens: 10490},
		},
		// Budgets spent by earlier attempts of the job count against the caps.
		{
			name:      "earlier attempts made 2 of 3 tool calls",
			limits:    func(l *config.Limits) { l.MaxToolCalls = 3 },
			spent:     agent.Budget{Turns: 2, ToolCalls: 2, Tokens: 3000},
			replies:   []reply{toolCalls(1000, emit("a"), emit("b"))},
			wantCap:   agent.CapMaxToolCalls,
			wantExecs: []string{"a"},
			wantReqs:  1,
			wantSpent: agent.Budget{Turns: 3, ToolCalls: 3, Tokens: 4000},
			wantSkip:  "not run: the job reached its cap of 3 tool calls (2 of them in earlier attempts)",
		},
		{
			name:      "earlier attempts used every turn",
			limits:    func(l *config.Limits) { l.MaxTurns = 3 },
			spent:     agent.Budget{Turns: 3, ToolCalls: 1, Tokens: 3000},
			wantCap:   agent.CapMaxTurns,
			wantReqs:  0,
			wantSpent: agent.Budget{Turns: 3, ToolCalls: 1, Tokens: 3000},
		},
		{
			name:      "earlier attempts used 2 of 3 turns",
			limits:    func(l *config.Limits) { l.MaxTurns = 3 },
			spent:     agent.Budget{Turns: 2},
			replies:   []reply{toolCalls(1000, emit("a"))},
			wantCap:   agent.CapMaxTurns,
			wantExecs: []string{"a"},
			wantReqs:  1,
			wantSpent: agent.Budget{Turns: 3, ToolCalls: 1, Tokens: 1000},
		},
		{
			name:      "earlier attempts used 900 of 1000 tokens",
			limits:    func(l *config.Limits) { l.MaxTokens = 10000 },
			spent:     agent.Budget{Turns: 1, Tokens: 9000},
			replies:   []reply{toolCalls(1000, emit("a"))},
			wantCap:   agent.CapMaxTokens,
			wantExecs: []string{"a"},
			wantReqs:  1,
			wantSpent: agent.Budget{Turns: 2, ToolCalls: 1, Tokens: 10000},
		},
		// A report of 2^63-1 tokens wrapped the job's spending negative on top of an earlier
		// attempt's 100: max_tokens never stopped the run, which went on for every reply. A
		// figure of a report counts at most 2^32 tokens.
		{
			name:   "earlier attempts' 100 tokens and an answer reporting 2^63-1",
			limits: func(l *config.Limits) { l.MaxTokens = 10000 },
			spent:  agent.Budget{Turns: 1, Tokens: 100},
			replies: []reply{withUsage(toolCalls(0, emit("a")), map[string]any{"prompt_tokens": int64(math.MaxInt64), "completion_tokens": 0, "total_tokens": int64(math.MaxInt64)}),
				toolCalls(1000, emit("b")), final("done")},
			wantCap:   agent.CapMaxTokens,
			wantExecs: []string{"a"},
			wantReqs:  1,
			wantSpent: agent.Budget{Turns: 2, ToolCalls: 1, Tokens: 100 + 1<<32},
		},
		{
			name:      "earlier attempts used every token",
			limits:    func(l *config.Limits) { l.MaxTokens = 10000 },
			spent:     agent.Budget{Turns: 1, Tokens: 10000},
			wantCap:   agent.CapMaxTokens,
			wantReqs:  0,
			wantSpent: agent.Budget{Turns: 1, Tokens: 10000},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			sb := newFakeSandbox(nil)
			s, res, err := limitedRun{replies: tt.replies, limits: tt.limits, tools: []config.Tool{emitTool}, sb: sb, spent: tt.spent}.run(t)
			if err != nil {
				t.Fatalf("Run: %v", err)
			}
			wantOutcome := agent.OutcomeCompleted
			if tt.wantCap != "" {
				wantOutcome = agent.OutcomeCapped
			}
			if res.Outcome != wantOutcome || res.Cap != tt.wantCap {
				t.Errorf("outcome %q cap %q, want %q cap %q", res.Outcome, res.Cap, wantOutcome, tt.wantCap)
			}
			var execs []string
			for _, argv := range sb.argvs() {
				execs = append(execs, argv[1])
			}
			if !reflect.DeepEqual(execs, tt.wantExecs) {
				t.Errorf("executed %q, want exactly %q", execs, tt.wantExecs)
			}
			if n := len(s.requests()); n != tt.wantReqs {
				t.Errorf("requests = %d, want %d", n, tt.wantReqs)
			}
			if res.Spent != tt.wantSpent {
				t.Errorf("spent = %+v, want %+v", res.Spent, tt.wantSpent)
			}
			var skipped []string
			lines := transcriptLines(t, res.Transcript)
			for _, l := range lines {
				if msg, _ := l["error"].(string); l["type"] == "tool_call" && strings.HasPrefix(msg, "not run") {
					skipped = append(skipped, msg)
				}
			}
			switch {
			case tt.wantSkip == "" && len(skipped) > 0:
				t.Errorf("calls answered %q, want every call run", skipped)
			case tt.wantSkip != "" && (len(skipped) == 0 || !strings.HasPrefix(skipped[0], tt.wantSkip)):
				t.Errorf("skipped calls answered %q, want %q", skipped, tt.wantSkip)
			}
			last := lines[len(lines)-1]
			want := map[string]any{"turns": float64(tt.wantSpent.Turns), "tool_calls": float64(tt.wantSpent.ToolCalls), "tokens": float64(tt.wantSpent.Tokens)}
			if !reflect.DeepEqual(last["spent"], want) {
				t.Errorf("final transcript line spent = %v, want %v", last["spent"], want)
			}
		})
	}
}

// TestProgressCarriesTheSpentBudget checks that every event counts what it announces, so a
// caller that records events loses nothing when the process dies in the middle of a step.
func TestProgressCarriesTheSpentBudget(t *testing.T) {
	s := newScript(t,
		toolCalls(1000, call{"a", "emit", `{"text":"a"}`}, call{"b", "emit", `{"text":"b"}`}),
		final("done"))
	req := request(csvProfile(t, emitTool), newFakeSandbox(nil))
	req.Spent = agent.Budget{Turns: 1, ToolCalls: 4, Tokens: 10000}
	var got []string
	req.Progress = func(e agent.Event) {
		got = append(got, fmt.Sprintf("%s turn=%d calls=%d spent=%d/%d/%d", e.Kind, e.Turn, e.ToolCalls, e.Spent.Turns, e.Spent.ToolCalls, e.Spent.Tokens))
	}
	res, err := newAgent(t, s).Run(context.Background(), req)
	if err != nil {
		t.Fatalf("Run: %v", err)
	}
	want := []string{
		"model_request turn=1 calls=0 spent=2/4/10000", // the request about to be sent counts
		"tool_call turn=1 calls=1 spent=2/5/11000",     // so does the call about to run
		"tool_call turn=1 calls=2 spent=2/6/11000",
		"model_request turn=2 calls=2 spent=3/6/11000",
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("events:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	if wantSpent := (agent.Budget{Turns: 3, ToolCalls: 6, Tokens: 11500}); res.Spent != wantSpent {
		t.Errorf("spent = %+v, want %+v", res.Spent, wantSpent)
	}
}

// TestSpentLeavesOutARequestTheEndpointWasUnavailableFor: a request that got no answer (here
// 503 after every retry) is no turn: the endpoint did no work for it, and a job must not lose
// turns to an outage.
func TestSpentLeavesOutARequestTheEndpointWasUnavailableFor(t *testing.T) {
	fast := map[string]string{"retry-after-ms": "1"}
	s := newScript(t, toolCalls(1000, call{"a", "emit", `{"text":"a"}`}),
		apiError(503, "", "overloaded", fast), apiError(503, "", "overloaded", fast), apiError(503, "", "overloaded", fast))
	res, err := newAgent(t, s).Run(context.Background(), request(csvProfile(t, emitTool), newFakeSandbox(nil)))
	if !errors.Is(err, agent.ErrModelUnavailable) {
		t.Fatalf("Run: %v, want ErrModelUnavailable", err)
	}
	if want := (agent.Budget{Turns: 1, ToolCalls: 1, Tokens: 1000}); res.Spent != want || res.Turns != 1 {
		t.Errorf("spent %+v turns %d, want %+v and 1 answered turn", res.Spent, res.Turns, want)
	}
}

func TestCaps(t *testing.T) {
	list := func(id string, tokens int64) reply { return toolCalls(tokens, call{id, "list_files", `{}`}) }
	tests := []struct {
		name      string
		limits    func(*config.Limits)
		tools     []config.Tool
		replies   []reply
		wantCap   string
		wantTurns int
		wantCalls int
		wantReqs  int
		wantFinal string
	}{
		{
			name:    "max_turns",
			limits:  func(l *config.Limits) { l.MaxTurns = 2 },
			replies: []reply{list("c1", 1000), list("c2", 1000)},
			wantCap: agent.CapMaxTurns, wantTurns: 2, wantCalls: 2, wantReqs: 2,
		},
		{
			name:   "max_tool_calls hit inside a response",
			limits: func(l *config.Limits) { l.MaxToolCalls = 2 },
			replies: []reply{toolCalls(1000,
				call{"c1", "list_files", `{}`}, call{"c2", "nope", `{}`}, call{"c3", "list_files", `{}`})},
			wantCap: agent.CapMaxToolCalls, wantTurns: 1, wantCalls: 2, wantReqs: 1,
		},
		{
			name:    "max_tokens",
			limits:  func(l *config.Limits) { l.MaxTokens = 10000 },
			replies: []reply{list("c1", 6000), list("c2", 6000)},
			wantCap: agent.CapMaxTokens, wantTurns: 2, wantCalls: 2, wantReqs: 2,
		},
		{
			name:    "job_timeout during a tool call",
			limits:  func(l *config.Limits) { l.JobTimeout = config.Duration(300 * time.Millisecond) },
			tools:   []config.Tool{slowTool},
			replies: []reply{toolCalls(1000, call{"c1", "slow", `{}`}, call{"c2", "list_files", `{}`})},
			wantCap: agent.CapJobTimeout, wantTurns: 1, wantCalls: 1, wantReqs: 1,
		},
		{
			name:    "job_timeout while the model thinks",
			limits:  func(l *config.Limits) { l.JobTimeout = config.Duration(300 * time.Millisecond) },
			replies: []reply{list("c1", 100), {hang: true}},
			wantCap: agent.CapJobTimeout, wantTurns: 1, wantCalls: 1, wantReqs: 2,
		},
		{
			// A cut answer is not the model's last word: capped, with what it wrote kept.
			name:   "an answer cut at the model's length limit",
			limits: func(*config.Limits) {},
			replies: []reply{list("c1", 100), completion(map[string]any{"role": "assistant", "content": "The sales rose in", "refusal": nil},
				"length", 100)},
			wantCap: agent.CapAnswerLength, wantTurns: 2, wantCalls: 1, wantReqs: 2, wantFinal: "The sales rose in",
		},
		{
			// The answer is not sent back, nor are its calls run.
			name:   "max_conversation_bytes passed by an answer",
			limits: func(l *config.Limits) { l.MaxConversationBytes = 64 << 10 },
			replies: []reply{list("c1", 100), completion(map[string]any{"role": "assistant", "content": strings.Repeat("x", 64<<10),
				"tool_calls": []map[string]any{{"id": "c2", "type": "function", "function": map[string]any{"name": "list_files", "arguments": `{}`}}}},
				"tool_calls", 100)},
			wantCap: agent.CapMaxConversationBytes, wantTurns: 2, wantCalls: 1, wantReqs: 2,
		},
		{
			// Each result is max_output_bytes (16 KiB) and a little: the fourth passes 64 KiB.
			name:   "max_conversation_bytes passed by a tool result",
			limits: func(l *config.Limits) { l.MaxConversationBytes, l.MaxOutputBytes = 64<<10, 16<<10 },
			tools:  []config.Tool{printTool},
			replies: []reply{toolCalls(1000, call{"c1", "print", `{"n":20000}`}, call{"c2", "print", `{"n":20000}`},
				call{"c3", "print", `{"n":20000}`}, call{"c4", "print", `{"n":20000}`}, call{"c5", "print", `{"n":20000}`})},
			wantCap: agent.CapMaxConversationBytes, wantTurns: 1, wantCalls: 4, wantReqs: 1,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			sb := newFakeSandbox(map[string]string{"sales.csv": salesCSV})
			s, res, err := limitedRun{replies: tt.replies, limits: tt.limits, tools: tt.tools, sb: sb}.run(t)
			if err != nil {
				t.Fatalf("Run: %v, want a capped result and no error", err)
			}
			if res.Outcome != agent.OutcomeCapped || res.Cap != tt.wantCap {
				t.Errorf("outcome = %q cap %q, want capped %q", res.Outcome, res.Cap, tt.wantCap)
			}
			if res.FinalMessage != tt.wantFinal {
				t.Errorf("final message %q, want %q", res.FinalMessage, tt.wantFinal)
			}
			if res.Turns != tt.wantTurns || len(res.ToolCalls) != tt.wantCalls || len(s.requests()) != tt.wantReqs {
				t.Errorf("turns %d, tool calls %d, requests %d; want %d, %d, %d",
					res.Turns, len(res.ToolCalls), len(s.requests()), tt.wantTurns, tt.wantCalls, tt.wantReqs)
			}
			lines := transcriptLines(t, res.Transcript)
			last := lines[len(lines)-1]
			if last["type"] != "final" || last["outcome"] != "capped" || last["cap"] != tt.wantCap {
				t.Errorf("last transcript line = %v, want final capped %s", last, tt.wantCap)
			}
		})
	}
}

// TestCallsPastTheCap: the calls of an answer that do not run (past max_tool_calls, or in an
// answer past max_conversation_bytes) are answered "not run" in the transcript, each id its
// line, up to 16 of them; the rest are counted in one not_run line. An answer may hold hundreds
// of thousands of calls: a line each filled the transcript, and the run's final line was
// dropped (30,000 calls past a cap of 16: 25,848 tool_call lines in the 8 MiB, 4,153 dropped, no
// final line).
func TestCallsPastTheCap(t *testing.T) {
	many := func(n int, content string) reply {
		tcs := make([]map[string]any, n)
		for i := range tcs {
			tcs[i] = map[string]any{"id": "", "type": "function", "function": map[string]any{"name": "list_files", "arguments": ""}}
		}
		return completion(map[string]any{"role": "assistant", "content": content, "tool_calls": tcs}, "tool_calls", 1000)
	}
	tests := []struct {
		name       string
		replies    []reply
		limits     func(*config.Limits)
		wantCap    string
		wantLines  int // tool_call lines
		wantNotRun int // calls the not_run line counts
	}{
		{name: "three calls past a cap of 1",
			replies: []reply{toolCalls(1000, call{"c1", "list_files", `{}`}, call{"c2", "list_files", `{}`}, call{"c3", "list_files", `{}`})},
			limits:  func(l *config.Limits) { l.MaxToolCalls = 1 }, wantCap: agent.CapMaxToolCalls, wantLines: 3},
		{name: "30,000 calls past a cap of 16", replies: []reply{many(30000, "")},
			limits: func(l *config.Limits) { l.MaxToolCalls = 16 }, wantCap: agent.CapMaxToolCalls, wantLines: 32, wantNotRun: 30000 - 32},
		{name: "30,000 calls in an answer past max_conversation_bytes", replies: []reply{many(30000, strings.Repeat("x", 64<<10))},
			limits: func(l *config.Limits) { l.MaxConversationBytes = 64 << 10 }, wantCap: agent.CapMaxConversationBytes, wantLines: 16, wantNotRun: 30000 - 16},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, res, err := limitedRun{replies: tt.replies, limits: tt.limits, sb: newFakeSandbox(nil)}.run(t)
			if err != nil || res.Cap != tt.wantCap {
				t.Fatalf("Run = cap %q, %v; want %s", res.Cap, err, tt.wantCap)
			}
			lines := transcriptLines(t, res.Transcript)
			calls, notRun := 0, 0
			for _, l := range lines {
				switch l["type"] {
				case "tool_call":
					calls++
					if msg, _ := l["error"].(string); calls > len(res.ToolCalls) && !strings.HasPrefix(msg, "not run") {
						t.Errorf("call %v: error = %q, want not run", l["id"], msg)
					}
				case "not_run":
					n, _ := l["calls"].(float64)
					notRun += int(n)
				}
			}
			if calls != tt.wantLines || notRun != tt.wantNotRun {
				t.Errorf("transcript: %d tool_call lines and %d calls counted not run; want %d and %d", calls, notRun, tt.wantLines, tt.wantNotRun)
			}
			if last := lines[len(lines)-1]; last["type"] != "final" || last["cap"] != tt.wantCap {
				t.Errorf("last transcript line = %.300v; want the final line, capped %s", last, tt.wantCap)
			}
		})
	}
}

// TestConversationHeldIsBounded: each answer may be up to Config.MaxResponseBytes, and the
// conversation keeps every answer that calls a tool and every tool result, sending all of it
// back at each turn: an endpoint (hostile, broken, or a proxy in front of it) that answers
// megabytes with a tool call every turn made the worker hold max_turns times that per job, and
// send it back growing. The profile's max_conversation_bytes (default 8 MiB) bounds it: the
// answer that would pass it ends the run capped, its calls not run and nothing more sent. It
// counts the conversation as sent, in JSON: counted in raw bytes, answers of control
// characters (6 bytes each as sent) had a request of 46,803,087 bytes sent under the default
// 8 MiB, and under 64 KiB one of 363,371; tool results of backslashes, whose escapes are escaped
// again as the request carries them, one of 101,663.
func TestConversationHeldIsBounded(t *testing.T) {
	answers := func(n int, content string) []reply {
		var replies []reply
		for i := range n {
			replies = append(replies, completion(map[string]any{"role": "assistant", "content": content,
				"tool_calls": []map[string]any{{"id": fmt.Sprintf("c%d", i), "type": "function",
					"function": map[string]any{"name": "list_files", "arguments": `{}`}}}}, "tool_calls", int64(len(content)/4)))
		}
		return replies
	}
	tests := []struct {
		name      string
		replies   []reply
		limits    func(*config.Limits)
		wantCalls int
	}{
		{name: "answers of 3 MiB of text", wantCalls: 2, // three of them pass the default's 8 MiB
			replies: answers(6, strings.Repeat("x", 3<<20)), limits: func(*config.Limits) {}},
		{name: "answers of control characters", wantCalls: 0,
			replies: answers(6, strings.Repeat("\x01", 20000)),
			limits:  func(l *config.Limits) { l.MaxConversationBytes = 64 << 10 }},
		{name: "tool results of backslashes", wantCalls: 2,
			replies: []reply{toolCalls(100, call{"c1", "print", `{"n":1}`}), toolCalls(100, call{"c2", "print", `{"n":1}`}),
				toolCalls(100, call{"c3", "print", `{"n":1}`}), toolCalls(100, call{"c4", "print", `{"n":1}`}), toolCalls(100, call{"c5", "print", `{"n":1}`})},
			limits: func(l *config.Limits) { l.MaxConversationBytes, l.MaxOutputBytes = 64<<10, 16<<10 }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var p config.Profile
			limits := func(l *config.Limits) {
				l.MaxTurns = len(tt.replies)
				l.MaxTokens = 1 << 40 // the answers' tokens are not what stops the run
				tt.limits(l)
				p.Limits = *l
			}
			sb := floodSandbox{fakeSandbox: newFakeSandbox(map[string]string{"sales.csv": salesCSV}), stdout: strings.Repeat("\\", 1<<20)}
			s, res, err := limitedRun{replies: tt.replies, limits: limits, tools: []config.Tool{printTool}, sb: sb}.run(t)
			if err != nil {
				t.Fatalf("Run: %v", err)
			}
			reqs := s.requests()
			largest := 0
			for _, r := range reqs {
				largest = max(largest, len(r.raw))
			}
			// The system prompt, the task and the tools' definitions (the first request) come on
			// top of the conversation, and the JSON around each message.
			bound := len(reqs[0].raw) + int(p.Limits.MaxConversationBytes) + 4<<10
			if res.Cap != "max_conversation_bytes" || largest > bound {
				t.Errorf("capped %q after %d requests, the largest %d bytes; want capped max_conversation_bytes with no request over %d bytes",
					res.Cap, len(reqs), largest, bound)
			}
			if n := len(res.ToolCalls); n != tt.wantCalls {
				t.Errorf("%d tool calls ran, want %d: those of the answers within the cap", n, tt.wantCalls)
			}
		})
	}
}

// limitedRun is a run of the caps' tests: the scripted replies on the csv profile with tools
// added, its limits changed by limits, in sb, the job's earlier attempts having spent spent.
type limitedRun struct {
	replies []reply
	limits  func(*config.Limits)
	tools   []config.Tool
	sb      agent.Sandbox
	spent   agent.Budget
}

// run runs it and returns the script (what was sent), the result and Run's error.
func (l limitedRun) run(t *testing.T) (*script, agent.Result, error) {
	t.Helper()
	s := newScript(t, l.replies...)
	p := csvProfile(t, l.tools...)
	l.limits(&p.Limits)
	req := request(p, l.sb)
	req.Spent = l.spent
	res, err := newAgent(t, s).Run(context.Background(), req)
	return s, res, err
}
