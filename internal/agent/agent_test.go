package agent_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/boxcar-run/boxcar/internal/agent"
	"github.com/boxcar-run/boxcar/internal/config"
	"github.com/boxcar-run/boxcar/internal/job"
)

func TestRunHappyPath(t *testing.T) {
	s := newScript(t,
		fixture(t, "openai_list_files.json"),
		fixture(t, "openai_csv_stats.json"),
		fixture(t, "openai_write_file.json"),
		fixture(t, "openai_final.json"),
	)
	var logs syncBuffer
	a := newAgent(t, s, func(c *agent.Config) { c.Logger = jsonLogger(&logs) })
	sb := newFakeSandbox(map[string]string{"sales.csv": salesCSV})
	var events []agent.Event
	req := request(csvProfile(t), sb)
	req.Progress = func(e agent.Event) { events = append(events, e) }

	res, err := a.Run(context.Background(), req)
	if err != nil {
		t.Fatalf("Run: %v", err)
	}
	if res.Outcome != agent.OutcomeCompleted || res.Cap != "" {
		t.Errorf("outcome = %q cap %q, want completed", res.Outcome, res.Cap)
	}
	if want := "Wrote report.md: 12 rows of sales, 92 units in all."; res.FinalMessage != want {
		t.Errorf("final message = %q, want %q", res.FinalMessage, want)
	}
	if res.Turns != 4 {
		t.Errorf("turns = %d, want 4", res.Turns)
	}
	wantUsage := agent.Usage{PromptTokens: 402 + 480 + 655 + 720, CompletionTokens: 12 + 18 + 41 + 17, TotalTokens: 414 + 498 + 696 + 737}
	if res.Usage != wantUsage {
		t.Errorf("usage = %+v, want %+v", res.Usage, wantUsage)
	}
	if res.Model != "gpt-4.1-mini-2025-04-14" {
		t.Errorf("model = %q, want the endpoint's gpt-4.1-mini-2025-04-14", res.Model)
	}
	wantIDs := []string{"chatcmpl-CjR8xA1listfiles", "chatcmpl-CjR8yB2csvstats", "chatcmpl-CjR8zC3writefile", "chatcmpl-CjR90D4final"}
	if !reflect.DeepEqual(res.ResponseIDs, wantIDs) {
		t.Errorf("response ids = %v, want %v", res.ResponseIDs, wantIDs)
	}

	// The tool calls, as recorded for the manifest.
	var tools, ids []string
	for _, tc := range res.ToolCalls {
		tools, ids = append(tools, tc.Tool), append(ids, tc.ID)
		if tc.ExitCode != 0 || tc.Error != "" || tc.TimedOut || tc.Truncated {
			t.Errorf("tool call %s: %+v, want a clean success", tc.Tool, tc)
		}
	}
	if want := []string{"list_files", "csv_stats", "write_file"}; !reflect.DeepEqual(tools, want) {
		t.Errorf("tools called = %v, want %v", tools, want)
	}
	if want := []string{"call_Lf0a1", "call_Cs0b2", "call_Wf0c3"}; !reflect.DeepEqual(ids, want) {
		t.Errorf("tool call ids = %v, want %v", ids, want)
	}
	sum := sha256.Sum256([]byte(`{"path":"sales.csv"}`))
	if got := res.ToolCalls[1].ArgsSHA256; got != hex.EncodeToString(sum[:]) {
		t.Errorf("csv_stats args digest = %s, want the SHA-256 of its arguments", got)
	}

	// What happened in the sandbox.
	argvs := sb.argvs()
	if len(argvs) != 1 || argvs[0][0] != "python3" || argvs[0][len(argvs[0])-1] != "sales.csv" {
		t.Errorf("execs = %q, want one python3 … sales.csv", argvs)
	}
	if report, _ := sb.file("report.md"); report != "# Sales report\n\n12 rows; units sum 92.\n" {
		t.Errorf("report.md = %q", report)
	}

	// What the endpoint saw.
	reqs := s.requests()
	if len(reqs) != 4 {
		t.Fatalf("the endpoint got %d requests, want 4", len(reqs))
	}
	first := messages(t, reqs[0])
	if len(first) != 2 || first[0]["role"] != "system" || first[1]["role"] != "user" {
		t.Fatalf("first request messages = %v, want system and user", first)
	}
	if task := first[1]["content"].(string); !strings.Contains(task, "Summarise the sales figures") || !strings.Contains(task, "- sales.csv") {
		t.Errorf("first user message = %q, want the task and the input list", task)
	}
	for i, r := range reqs {
		if r.path != "/v1/chat/completions" {
			t.Errorf("request %d path = %s", i+1, r.path)
		}
		if r.auth != "Bearer "+testKey {
			t.Errorf("request %d Authorization = %q, want the bearer key", i+1, r.auth)
		}
		if r.body["model"] != "gpt-4.1-mini" {
			t.Errorf("request %d model = %v, want the profile's gpt-4.1-mini", i+1, r.body["model"])
		}
		if temp, ok := r.body["temperature"]; !ok || temp != 0.0 {
			t.Errorf("request %d temperature = %v (present %v), want 0 sent explicitly", i+1, temp, ok)
		}
		if got, want := jsonText(t, r.body["tools"]), jsonText(t, reqs[0].body["tools"]); got != want {
			t.Errorf("request %d tools differ from the first request's", i+1)
		}
	}
	var toolNames []string
	for _, tool := range reqs[0].body["tools"].([]any) {
		toolNames = append(toolNames, tool.(map[string]any)["function"].(map[string]any)["name"].(string))
	}
	if want := []string{"list_files", "read_file", "write_file", "csv_stats"}; !reflect.DeepEqual(toolNames, want) {
		t.Errorf("tools offered = %v, want %v", toolNames, want)
	}

	// The tool results, in the documented format.
	listed := lastToolResult(t, reqs[1])
	if got := jsonText(t, listed["files"]); got != `[{"path":"sales.csv","size":`+strconv.Itoa(len(salesCSV))+`}]` {
		t.Errorf("list_files result files = %s", got)
	}
	stats := lastToolResult(t, reqs[2])
	if stats["exit_code"] != 0.0 || stats["timed_out"] != false || stats["stdout_truncated"] != false || stats["stderr_truncated"] != false {
		t.Errorf("csv_stats result = %v, want exit 0 and no flags", stats)
	}
	if !strings.Contains(stats["stdout"].(string), statsTable) {
		t.Errorf("csv_stats stdout = %q, want the table", stats["stdout"])
	}
	written := lastToolResult(t, reqs[3])
	if written["written"] != float64(len("# Sales report\n\n12 rows; units sum 92.\n")) || written["path"] != "report.md" {
		t.Errorf("write_file result = %v", written)
	}

	// Progress events.
	var kinds []string
	for _, e := range events {
		kinds = append(kinds, e.Kind+":"+e.Tool)
		if e.MaxToolCalls != 16 {
			t.Errorf("event %+v: MaxToolCalls = %d, want the profile's 16", e, e.MaxToolCalls)
		}
	}
	wantKinds := []string{"model_request:", "tool_call:list_files", "model_request:", "tool_call:csv_stats", "model_request:", "tool_call:write_file", "model_request:"}
	if !reflect.DeepEqual(kinds, wantKinds) {
		t.Errorf("events = %v, want %v", kinds, wantKinds)
	}

	// The transcript.
	lines := transcriptLines(t, res.Transcript)
	wantTypes := []string{"request", "response", "tool_call", "request", "response", "tool_call", "request", "response", "tool_call", "request", "response", "final"}
	if got := lineTypes(lines); !reflect.DeepEqual(got, wantTypes) {
		t.Errorf("transcript line types = %v, want %v", got, wantTypes)
	}
	if _, ok := lines[0]["params"]; !ok {
		t.Error("the first request line has no params")
	}
	if lines[11]["outcome"] != "completed" {
		t.Errorf("final line = %v", lines[11])
	}

	// Logs: every line names the job; none holds tool output.
	for _, l := range strings.Split(strings.TrimSpace(logs.String()), "\n") {
		if !strings.Contains(l, `"job_id":"20261202t101500-0a1b2c3d4e5f"`) {
			t.Errorf("log line without job_id: %s", l)
		}
	}
	if strings.Contains(logs.String(), "unit_price") {
		t.Error("the log holds tool output")
	}
}

func TestParallelToolCallsAnsweredInOrder(t *testing.T) {
	s := newScript(t, fixture(t, "openai_parallel.json"), final("done"))
	sb := newFakeSandbox(map[string]string{"sales.csv": salesCSV})
	res, err := newAgent(t, s).Run(context.Background(), request(csvProfile(t), sb))
	if err != nil {
		t.Fatalf("Run: %v", err)
	}
	reqs := s.requests()
	if len(reqs) != 2 {
		t.Fatalf("requests = %d, want 2", len(reqs))
	}
	want := []string{"call_P1", "call_P2", "call_P3"}
	if got := assistantCallIDs(t, reqs[1]); !reflect.DeepEqual(got, want) {
		t.Errorf("assistant tool call ids = %v, want %v", got, want)
	}
	ids, results := toolResults(t, reqs[1])
	if !reflect.DeepEqual(ids, want) {
		t.Errorf("tool message ids = %v, want %v in order", ids, want)
	}
	msgs := messages(t, reqs[1])
	if roles := []any{msgs[2]["role"], msgs[3]["role"], msgs[4]["role"], msgs[5]["role"]}; !reflect.DeepEqual(roles, []any{"assistant", "tool", "tool", "tool"}) {
		t.Errorf("roles after the user message = %v, want the assistant message then its three tool messages", roles)
	}
	if _, ok := results[0]["files"]; !ok {
		t.Errorf("first result %v, want list_files' files", results[0])
	}
	if results[1]["content"] != salesCSV[:40] || results[1]["truncated"] != true || results[1]["next_offset"] != 40.0 {
		t.Errorf("second result %v, want read_file's first 40 bytes", results[1])
	}
	if _, ok := results[2]["stdout"]; !ok {
		t.Errorf("third result %v, want csv_stats' stdout", results[2])
	}
	if len(res.ToolCalls) != 3 {
		t.Errorf("tool calls = %d, want 3", len(res.ToolCalls))
	}
}

func TestToolCallErrors(t *testing.T) {
	tests := []struct {
		name       string
		tool, args string
		wantPrefix string
	}{
		{name: "unknown tool", tool: "rm_rf", args: `{}`, wantPrefix: `tool "rm_rf" not found`},
		{name: "invalid JSON", tool: "csv_stats", args: `{"path": "sales.csv"`, wantPrefix: "invalid arguments"},
		{name: "arguments not an object", tool: "csv_stats", args: `["sales.csv"]`, wantPrefix: "invalid arguments"},
		{name: "pattern mismatch", tool: "csv_stats", args: `{"path": "sales.csv; rm -rf /"}`, wantPrefix: "invalid arguments"},
		{name: "pattern refuses a leading dash", tool: "csv_stats", args: `{"path": "--help.csv"}`, wantPrefix: "invalid arguments"},
		{name: "extra property", tool: "csv_stats", args: `{"path": "sales.csv", "mode": "fast"}`, wantPrefix: "invalid arguments"},
		{name: "missing required", tool: "csv_stats", args: `{}`, wantPrefix: "invalid arguments"},
		{name: "wrong type", tool: "csv_stats", args: `{"path": 5}`, wantPrefix: "invalid arguments"},
		{name: "read_file climbs out", tool: "read_file", args: `{"path": "../etc/passwd"}`, wantPrefix: `path "../etc/passwd" outside the workdir`},
		{name: "read_file absolute", tool: "read_file", args: `{"path": "/etc/passwd"}`, wantPrefix: `path "/etc/passwd" outside the workdir`},
		{name: "write_file climbs out", tool: "write_file", args: `{"path": "a/../../x", "content": "x"}`, wantPrefix: `path "a/../../x" outside the workdir`},
		{name: "list_files climbs out", tool: "list_files", args: `{"path": ".."}`, wantPrefix: `path ".." outside the workdir`},
		{name: "read_file missing file", tool: "read_file", args: `{"path": "nope.txt"}`, wantPrefix: "failed:"},
		{name: "read_file extra property", tool: "read_file", args: `{"path": "sales.csv", "encoding": "latin1"}`, wantPrefix: "invalid arguments"},
		{name: "write_file too large", tool: "write_file", args: `{"path": "big.txt", "content": "` + strings.Repeat("a", 1<<20+1) + `"}`, wantPrefix: "invalid arguments"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := newScript(t, toolCalls(100, call{"call_1", tt.tool, tt.args}), final("gave up"))
			sb := newFakeSandbox(map[string]string{"sales.csv": salesCSV})
			res, err := newAgent(t, s).Run(context.Background(), request(csvProfile(t), sb))
			if err != nil {
				t.Fatalf("Run: %v", err)
			}
			if res.Outcome != agent.OutcomeCompleted {
				t.Errorf("outcome = %q, want completed: a bad call is data, not the end", res.Outcome)
			}
			if len(res.ToolCalls) != 1 {
				t.Fatalf("tool calls = %d, want 1 (invalid calls count)", len(res.ToolCalls))
			}
			tc := res.ToolCalls[0]
			if !strings.HasPrefix(tc.Error, tt.wantPrefix) || tc.ExitCode != -1 {
				t.Errorf("recorded error = %q exit %d, want prefix %q and -1", tc.Error, tc.ExitCode, tt.wantPrefix)
			}
			got := lastToolResult(t, s.requests()[1])
			if msg, _ := got["error"].(string); !strings.HasPrefix(msg, tt.wantPrefix) || len(got) != 1 {
				t.Errorf("tool result = %v, want only {\"error\": %q…}", got, tt.wantPrefix)
			}
			if argvs := sb.argvs(); len(argvs) != 0 {
				t.Errorf("execs = %q, want none", argvs)
			}
			if _, ok := sb.file("big.txt"); ok {
				t.Error("an oversized write reached the sandbox")
			}
		})
	}
}

func TestServerQuirks(t *testing.T) {
	tests := []struct {
		name     string
		fixture  string
		wantCall int // tool calls run
	}{
		{name: "finish_reason stop with tool calls (vLLM)", fixture: "vllm_stop_with_tool_calls.json", wantCall: 1},
		{name: "missing and empty ids", fixture: "missing_ids.json", wantCall: 2},
		{name: "duplicate ids", fixture: "duplicate_ids.json", wantCall: 2},
		{name: "empty arguments string", fixture: "empty_arguments.json", wantCall: 1},
		{name: "arguments as an object", fixture: "object_arguments.json", wantCall: 1},
		{name: "arguments double encoded", fixture: "double_encoded_arguments.json", wantCall: 1},
		{name: "finish_reason tool_calls without calls", fixture: "tool_calls_finish_without_calls.json", wantCall: 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			replies := []reply{fixture(t, tt.fixture)}
			if tt.wantCall > 0 {
				replies = append(replies, final("done"))
			}
			s := newScript(t, replies...)
			sb := newFakeSandbox(map[string]string{"sales.csv": salesCSV})
			res, err := newAgent(t, s).Run(context.Background(), request(csvProfile(t), sb))
			if err != nil {
				t.Fatalf("Run: %v", err)
			}
			if res.Outcome != agent.OutcomeCompleted {
				t.Errorf("outcome = %q, want completed", res.Outcome)
			}
			if len(res.ToolCalls) != tt.wantCall {
				t.Fatalf("tool calls = %d, want %d", len(res.ToolCalls), tt.wantCall)
			}
			seen := map[string]bool{}
			for _, tc := range res.ToolCalls {
				if tc.Error != "" {
					t.Errorf("tool call %s failed: %s", tc.Tool, tc.Error)
				}
				if tc.ID == "" || seen[tc.ID] {
					t.Errorf("tool call id %q is empty or repeated", tc.ID)
				}
				seen[tc.ID] = true
			}
			if tt.wantCall == 0 {
				if res.FinalMessage != "Nothing left to do." {
					t.Errorf("final message = %q", res.FinalMessage)
				}
				return
			}
			next := s.requests()[1]
			asked := assistantCallIDs(t, next)
			answered, _ := toolResults(t, next)
			if !reflect.DeepEqual(asked, answered) || len(asked) != tt.wantCall {
				t.Errorf("assistant call ids %v, tool message ids %v: want the same %d ids", asked, answered, tt.wantCall)
			}
		})
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
	}{
		{
			name:    "max_turns",
			limits:  func(l *config.Limits) { l.MaxTurns = 2 },
			replies: []reply{list("c1", 100), list("c2", 100)},
			wantCap: agent.CapMaxTurns, wantTurns: 2, wantCalls: 2, wantReqs: 2,
		},
		{
			name:   "max_tool_calls hit inside a response",
			limits: func(l *config.Limits) { l.MaxToolCalls = 2 },
			replies: []reply{toolCalls(100,
				call{"c1", "list_files", `{}`}, call{"c2", "nope", `{}`}, call{"c3", "list_files", `{}`})},
			wantCap: agent.CapMaxToolCalls, wantTurns: 1, wantCalls: 2, wantReqs: 1,
		},
		{
			name:    "max_tokens",
			limits:  func(l *config.Limits) { l.MaxTokens = 1000 },
			replies: []reply{list("c1", 600), list("c2", 600)},
			wantCap: agent.CapMaxTokens, wantTurns: 2, wantCalls: 2, wantReqs: 2,
		},
		{
			name:    "job_timeout during a tool call",
			limits:  func(l *config.Limits) { l.JobTimeout = config.Duration(300 * time.Millisecond) },
			tools:   []config.Tool{slowTool},
			replies: []reply{toolCalls(100, call{"c1", "slow", `{}`}, call{"c2", "list_files", `{}`})},
			wantCap: agent.CapJobTimeout, wantTurns: 1, wantCalls: 1, wantReqs: 1,
		},
		{
			name:    "job_timeout while the model thinks",
			limits:  func(l *config.Limits) { l.JobTimeout = config.Duration(300 * time.Millisecond) },
			replies: []reply{list("c1", 100), {hang: true}},
			wantCap: agent.CapJobTimeout, wantTurns: 1, wantCalls: 1, wantReqs: 2,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := newScript(t, tt.replies...)
			p := csvProfile(t, tt.tools...)
			tt.limits(&p.Limits)
			sb := newFakeSandbox(map[string]string{"sales.csv": salesCSV})
			res, err := newAgent(t, s).Run(context.Background(), request(p, sb))
			if err != nil {
				t.Fatalf("Run: %v, want a capped result and no error", err)
			}
			if res.Outcome != agent.OutcomeCapped || res.Cap != tt.wantCap {
				t.Errorf("outcome = %q cap %q, want capped %q", res.Outcome, res.Cap, tt.wantCap)
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

func TestCapMaxToolCallsAnswersEveryCall(t *testing.T) {
	s := newScript(t, toolCalls(100, call{"c1", "list_files", `{}`}, call{"c2", "list_files", `{}`}, call{"c3", "list_files", `{}`}))
	p := csvProfile(t)
	p.Limits.MaxToolCalls = 1
	res, err := newAgent(t, s).Run(context.Background(), request(p, newFakeSandbox(nil)))
	if err != nil || res.Cap != agent.CapMaxToolCalls {
		t.Fatalf("Run = cap %q, %v; want max_tool_calls", res.Cap, err)
	}
	var calls []map[string]any
	for _, l := range transcriptLines(t, res.Transcript) {
		if l["type"] == "tool_call" {
			calls = append(calls, l)
		}
	}
	if len(calls) != 3 {
		t.Fatalf("transcript tool_call lines = %d, want 3 (one per call id)", len(calls))
	}
	for _, c := range calls[1:] {
		if msg, _ := c["error"].(string); !strings.HasPrefix(msg, "not run") {
			t.Errorf("call %v: error = %q, want not run", c["id"], msg)
		}
	}
}

func TestModelErrors(t *testing.T) {
	fast := map[string]string{"retry-after-ms": "10"}
	tests := []struct {
		name     string
		replies  []reply
		wantErr  error
		wantReqs int
	}{
		{name: "401 is permanent and not retried", replies: []reply{apiError(401, "invalid_api_key", "Incorrect API key provided: "+testKey, nil)}, wantErr: agent.ErrModelAuth, wantReqs: 1},
		{name: "403 is permanent and not retried", replies: []reply{apiError(403, "", "Project does not have access", nil)}, wantErr: agent.ErrModelAuth, wantReqs: 1},
		{name: "404 unknown model", replies: []reply{apiError(404, "model_not_found", "The model `gpt-nope` does not exist", nil)}, wantErr: agent.ErrModelRequest, wantReqs: 1},
		{name: "400 bad request", replies: []reply{apiError(400, "", "Invalid schema for function 'csv_stats'", nil)}, wantErr: agent.ErrModelRequest, wantReqs: 1},
		{name: "422 unprocessable", replies: []reply{apiError(422, "", "unprocessable", nil)}, wantErr: agent.ErrModelRequest, wantReqs: 1},
		{name: "500s until the retries run out", replies: []reply{apiError(500, "", "boom", fast), apiError(502, "", "bad gateway", fast), apiError(503, "", "overloaded", fast)}, wantErr: agent.ErrModelUnavailable, wantReqs: 3},
		{name: "429s until the retries run out", replies: []reply{apiError(429, "rate_limit_exceeded", "slow down", fast), apiError(429, "", "slow down", fast), apiError(429, "", "slow down", fast)}, wantErr: agent.ErrModelUnavailable, wantReqs: 3},
		{name: "no choices", replies: []reply{{body: `{"id":"chatcmpl-x","object":"chat.completion","created":1,"model":"m","choices":[],"usage":{"prompt_tokens":1,"completion_tokens":0,"total_tokens":1}}`}}, wantErr: agent.ErrModelResponse, wantReqs: 1},
	}
	sentinels := []error{agent.ErrModelAuth, agent.ErrModelRequest, agent.ErrModelUnavailable, agent.ErrModelResponse}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := newScript(t, tt.replies...)
			res, err := newAgent(t, s).Run(context.Background(), request(csvProfile(t), newFakeSandbox(nil)))
			for _, sentinel := range sentinels {
				if got, want := errors.Is(err, sentinel), sentinel == tt.wantErr; got != want {
					t.Errorf("errors.Is(%v, %v) = %v, want %v", err, sentinel, got, want)
				}
			}
			if n := len(s.requests()); n != tt.wantReqs {
				t.Errorf("requests = %d, want %d", n, tt.wantReqs)
			}
			if strings.Contains(err.Error(), testKey) {
				t.Error("the error holds the API key")
			}
			if res.Outcome != "" {
				t.Errorf("outcome = %q, want none with an error", res.Outcome)
			}
			lines := transcriptLines(t, res.Transcript)
			if last := lines[len(lines)-1]; last["type"] != "final" || last["error"] == nil {
				t.Errorf("last transcript line = %v, want final with the error", last)
			}
		})
	}
}

func TestRetryAfterThenSuccess(t *testing.T) {
	s := newScript(t, apiError(429, "rate_limit_exceeded", "Rate limit reached", map[string]string{"Retry-After": "1"}), final("done"))
	res, err := newAgent(t, s).Run(context.Background(), request(csvProfile(t), newFakeSandbox(nil)))
	if err != nil {
		t.Fatalf("Run: %v", err)
	}
	if res.Outcome != agent.OutcomeCompleted || res.Turns != 1 {
		t.Errorf("outcome %q turns %d, want completed after 1 turn", res.Outcome, res.Turns)
	}
	reqs := s.requests()
	if len(reqs) != 2 {
		t.Fatalf("requests = %d, want 2", len(reqs))
	}
	if wait := reqs[1].at.Sub(reqs[0].at); wait < 900*time.Millisecond {
		t.Errorf("retried after %s, want Retry-After's 1s honoured", wait)
	}
	if jsonText(t, reqs[0].body) != jsonText(t, reqs[1].body) {
		t.Error("the retry sent a different body")
	}
}

func TestServerErrorThenSuccess(t *testing.T) {
	s := newScript(t, apiError(500, "", "The server had an error while processing your request.", map[string]string{"Retry-After": "0"}), final("done"))
	res, err := newAgent(t, s).Run(context.Background(), request(csvProfile(t), newFakeSandbox(nil)))
	if err != nil {
		t.Fatalf("Run: %v", err)
	}
	if res.Outcome != agent.OutcomeCompleted || res.FinalMessage != "done" {
		t.Errorf("outcome %q final %q, want completed with the answer after the retry", res.Outcome, res.FinalMessage)
	}
	if reqs := s.requests(); len(reqs) != 2 {
		t.Fatalf("requests = %d, want the failed one and its retry", len(reqs))
	}
}

func TestUnreachableEndpoint(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close() // nothing listens there now
	a, err := agent.New(agent.Config{BaseURL: "http://" + addr + "/v1", APIKey: testKey, MaxRetries: 1})
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	_, err = a.Run(context.Background(), request(csvProfile(t), newFakeSandbox(nil)))
	if !errors.Is(err, agent.ErrModelUnavailable) {
		t.Fatalf("Run error = %v, want ErrModelUnavailable", err)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("took %s to give up on a closed port", d)
	}
}

func TestParentCancel(t *testing.T) {
	s := newScript(t, toolCalls(100, call{"c1", "list_files", `{}`}), reply{hang: true})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	req := request(csvProfile(t), newFakeSandbox(map[string]string{"sales.csv": salesCSV}))
	req.Progress = func(e agent.Event) {
		if e.Kind == agent.EventModelRequest && e.Turn == 2 {
			go func() { <-s.arrived; <-s.arrived; cancel() }() // once the second request is in
		}
	}
	res, err := newAgent(t, s).Run(ctx, req)
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("Run error = %v, want context.Canceled", err)
	}
	if res.Turns != 1 || len(res.ToolCalls) != 1 || res.Outcome != "" {
		t.Errorf("partial result: turns %d, tool calls %d, outcome %q; want 1, 1, none", res.Turns, len(res.ToolCalls), res.Outcome)
	}
	if len(res.Transcript) == 0 {
		t.Error("no transcript with the partial result")
	}
}

func TestArgvSubstitution(t *testing.T) {
	tests := []struct {
		name     string
		args     string
		wantArgv []string
	}{
		{name: "shell metacharacters", args: `{"text": "; rm -rf /"}`, wantArgv: []string{"echo", "; rm -rf /"}},
		{name: "command substitution", args: `{"text": "$(id)"}`, wantArgv: []string{"echo", "$(id)"}},
		{name: "backticks and pipes", args: "{\"text\": \"`reboot` | tee /x > /y && z\"}", wantArgv: []string{"echo", "`reboot` | tee /x > /y && z"}},
		{name: "a flag", args: `{"text": "--flag"}`, wantArgv: []string{"echo", "--flag"}},
		{name: "whitespace and newlines", args: `{"text": "a b\tc\nd"}`, wantArgv: []string{"echo", "a b\tc\nd"}},
		{name: "empty string", args: `{"text": ""}`, wantArgv: []string{"echo", ""}},
		{name: "number and bool", args: `{"text": "x", "n": 3, "flag": true}`, wantArgv: []string{"echo", "x", "3", "true"}},
		{name: "numbers keep their spelling", args: `{"text": "x", "n": 1.50, "flag": false}`, wantArgv: []string{"echo", "x", "1.50", "false"}},
		{name: "large number", args: `{"text": "x", "n": 1e21}`, wantArgv: []string{"echo", "x", "1e21"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := newScript(t, toolCalls(100, call{"c1", "emit", tt.args}), final("ok"))
			sb := newFakeSandbox(nil)
			res, err := newAgent(t, s).Run(context.Background(), request(csvProfile(t, emitTool), sb))
			if err != nil {
				t.Fatalf("Run: %v", err)
			}
			if res.ToolCalls[0].Error != "" {
				t.Fatalf("emit failed: %s", res.ToolCalls[0].Error)
			}
			argvs := sb.argvs()
			if len(argvs) != 1 || !reflect.DeepEqual(argvs[0], tt.wantArgv) {
				t.Errorf("argv = %q, want %q", argvs, tt.wantArgv)
			}
		})
	}
}

func TestOutputTruncation(t *testing.T) {
	s := newScript(t, toolCalls(100, call{"c1", "print", `{"n": 100000}`}), final("ok"))
	p := csvProfile(t, printTool)
	p.Limits.MaxOutputBytes = 1000
	res, err := newAgent(t, s).Run(context.Background(), request(p, newFakeSandbox(nil)))
	if err != nil {
		t.Fatalf("Run: %v", err)
	}
	got := lastToolResult(t, s.requests()[1])
	stdout, _ := got["stdout"].(string)
	if len(stdout) > 1000 || !strings.HasPrefix(stdout, "BEGIN") || !strings.HasSuffix(stdout, "END") ||
		!strings.Contains(stdout, "\n…[") || !strings.Contains(stdout, " bytes cut]…\n") {
		t.Errorf("stdout to the model (%d bytes) = %.80q…, want head and tail within 1000 bytes around the marker", len(stdout), stdout)
	}
	if got["stdout_truncated"] != true || got["stderr_truncated"] != false {
		t.Errorf("flags = %v/%v, want stdout_truncated only", got["stdout_truncated"], got["stderr_truncated"])
	}
	if !res.ToolCalls[0].Truncated {
		t.Error("the tool call record is not flagged truncated")
	}
	for _, l := range transcriptLines(t, res.Transcript) {
		if l["type"] == "tool_call" {
			full := l["result"].(map[string]any)["stdout"].(string)
			if len(full) != 100000 {
				t.Errorf("transcript stdout = %d bytes, want the full 100000", len(full))
			}
		}
	}
}

func TestSecretsStayOut(t *testing.T) {
	s := newScript(t, toolCalls(100, call{"c1", "csv_stats", `{"path":"sales.csv"}`}), apiError(401, "invalid_api_key", "Incorrect API key provided: "+testKey, nil))
	var logs syncBuffer
	a := newAgent(t, s, func(c *agent.Config) { c.Logger = jsonLogger(&logs) })
	res, err := a.Run(context.Background(), request(csvProfile(t), newFakeSandbox(map[string]string{"sales.csv": salesCSV})))
	if !errors.Is(err, agent.ErrModelAuth) {
		t.Fatalf("Run error = %v, want ErrModelAuth", err)
	}
	if s.requests()[0].auth != "Bearer "+testKey {
		t.Fatal("the key was not sent, so this test proves nothing")
	}
	for name, text := range map[string]string{"transcript": string(res.Transcript), "log": logs.String(), "error": err.Error()} {
		if strings.Contains(text, testKey) {
			t.Errorf("the %s holds the API key", name)
		}
		if strings.Contains(strings.ToLower(text), "authorization") {
			t.Errorf("the %s mentions the Authorization header", name)
		}
	}
	if strings.Contains(logs.String(), "unit_price") {
		t.Error("the log holds tool output")
	}
}

func TestPromptInjectionIsData(t *testing.T) {
	s := newScript(t, toolCalls(100, call{"c1", "inject", `{}`}), final("ok"))
	p := csvProfile(t, injectTool)
	sb := newFakeSandbox(nil)
	res, err := newAgent(t, s).Run(context.Background(), request(p, sb))
	if err != nil {
		t.Fatalf("Run: %v", err)
	}
	reqs := s.requests()
	if len(reqs) != 2 {
		t.Fatalf("requests = %d, want 2", len(reqs))
	}
	first, second := messages(t, reqs[0]), messages(t, reqs[1])
	if jsonText(t, second[0]) != jsonText(t, first[0]) || second[0]["role"] != "system" {
		t.Error("the system prompt changed after the tool output")
	}
	if jsonText(t, reqs[1].body["tools"]) != jsonText(t, reqs[0].body["tools"]) {
		t.Error("the tools changed after the tool output")
	}
	if len(second) != 4 {
		t.Errorf("second request has %d messages, want system, user, assistant, tool", len(second))
	}
	if got := lastToolResult(t, reqs[1]); got["stdout"] != injection {
		t.Errorf("tool result stdout = %q, want the output verbatim as data", got["stdout"])
	}
	if len(sb.argvs()) != 1 || res.Outcome != agent.OutcomeCompleted || len(res.ToolCalls) != 1 {
		t.Errorf("execs %d, outcome %q, tool calls %d; want 1, completed, 1", len(sb.argvs()), res.Outcome, len(res.ToolCalls))
	}
}

// approver answers from a function.
type approver func(context.Context, agent.ApprovalRequest) (agent.Answer, error)

func (f approver) Approve(ctx context.Context, r agent.ApprovalRequest) (agent.Answer, error) {
	return f(ctx, r)
}

func TestShellPolicy(t *testing.T) {
	var asked []agent.ApprovalRequest
	decidedAt := time.Date(2026, 12, 2, 10, 16, 0, 0, time.UTC)
	yes := approver(func(_ context.Context, r agent.ApprovalRequest) (agent.Answer, error) {
		asked = append(asked, r)
		return agent.Answer{Approved: true, By: "alice@host", At: decidedAt}, nil
	})
	no := approver(func(context.Context, agent.ApprovalRequest) (agent.Answer, error) {
		return agent.Answer{By: "bob@host", At: decidedAt, Reason: "not today"}, nil
	})
	broken := approver(func(context.Context, agent.ApprovalRequest) (agent.Answer, error) {
		return agent.Answer{}, errors.New("queue down")
	})
	silent := approver(func(ctx context.Context, _ agent.ApprovalRequest) (agent.Answer, error) {
		<-ctx.Done()
		return agent.Answer{}, ctx.Err()
	})
	// Decided by the approvals transport, which marks the request expired when it gives up.
	expired := approver(func(ctx context.Context, _ agent.ApprovalRequest) (agent.Answer, error) {
		return agent.Answer{At: decidedAt}, fmt.Errorf("approval expired: %w", context.DeadlineExceeded)
	})
	// policy is how the record names a decision made by the profile alone.
	policy := func(p string, d job.Decision) *job.Approval { return &job.Approval{Policy: p, Decision: d} }
	tests := []struct {
		name         string
		policy       string
		allow        []string
		approver     agent.Approver
		args         string
		wantArgv     []string // nil: refused
		wantApproval *job.Approval
		waitEnded    bool // the agent stamps At itself, when the wait ended: checked for being set
	}{
		{name: "deny", policy: config.PolicyDeny, args: `{"command": ["ls", "-l"]}`,
			wantApproval: policy(config.PolicyDeny, job.DecisionDenied)},
		{name: "allowlist match", policy: config.PolicyAllowlist, allow: []string{"ls *"}, args: `{"command": ["ls", "-l"]}`, wantArgv: []string{"ls", "-l"},
			wantApproval: policy(config.PolicyAllowlist, job.DecisionApproved)},
		{name: "allowlist star crosses slashes", policy: config.PolicyAllowlist, allow: []string{"cat *"}, args: `{"command": ["cat", "data/sub/file.txt"]}`, wantArgv: []string{"cat", "data/sub/file.txt"},
			wantApproval: policy(config.PolicyAllowlist, job.DecisionApproved)},
		{name: "allowlist string form split on whitespace", policy: config.PolicyAllowlist, allow: []string{"git status"}, args: `{"command": "git   status"}`, wantArgv: []string{"git", "status"},
			wantApproval: policy(config.PolicyAllowlist, job.DecisionApproved)},
		{name: "allowlist mismatch", policy: config.PolicyAllowlist, allow: []string{"ls *"}, args: `{"command": ["rm", "-rf", "/"]}`,
			wantApproval: policy(config.PolicyAllowlist, job.DecisionDenied)},
		{name: "allowlist is anchored", policy: config.PolicyAllowlist, allow: []string{"ls"}, args: `{"command": ["ls", "-R", "/"]}`,
			wantApproval: policy(config.PolicyAllowlist, job.DecisionDenied)},
		{name: "allowlist no prefix trick", policy: config.PolicyAllowlist, allow: []string{"ls *"}, args: `{"command": ["lsblk"]}`,
			wantApproval: policy(config.PolicyAllowlist, job.DecisionDenied)},
		{name: "ask approved", policy: config.PolicyAsk, approver: yes, args: `{"command": ["make", "test"]}`, wantArgv: []string{"make", "test"},
			wantApproval: &job.Approval{Policy: config.PolicyAsk, Decision: job.DecisionApproved, DecidedBy: "alice@host", DecidedAt: decidedAt}},
		{name: "ask denied", policy: config.PolicyAsk, approver: no, args: `{"command": ["make", "test"]}`,
			wantApproval: &job.Approval{Policy: config.PolicyAsk, Decision: job.DecisionDenied, DecidedBy: "bob@host", DecidedAt: decidedAt}},
		{name: "ask without an approver", policy: config.PolicyAsk, args: `{"command": ["make", "test"]}`,
			wantApproval: policy(config.PolicyAsk, job.DecisionDenied)},
		{name: "ask with a failing approver", policy: config.PolicyAsk, approver: broken, args: `{"command": ["make", "test"]}`,
			wantApproval: &job.Approval{Policy: config.PolicyAsk, Decision: job.DecisionDenied}, waitEnded: true},
		{name: "ask unanswered in time", policy: config.PolicyAsk, approver: silent, args: `{"command": ["make", "test"]}`,
			wantApproval: &job.Approval{Policy: config.PolicyAsk, Decision: job.DecisionTimedOut}, waitEnded: true},
		{name: "ask expired by the transport", policy: config.PolicyAsk, approver: expired, args: `{"command": ["make", "test"]}`,
			wantApproval: &job.Approval{Policy: config.PolicyAsk, Decision: job.DecisionTimedOut, DecidedAt: decidedAt}},
		{name: "empty command", policy: config.PolicyAllowlist, allow: []string{"*"}, args: `{"command": []}`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			asked = nil
			s := newScript(t, toolCalls(100, call{"sh1", "shell", tt.args}), final("ok"))
			p := csvProfile(t, config.Tool{Name: "shell", Kind: config.ToolShell, Policy: tt.policy, Allow: tt.allow})
			p.Limits.ApprovalTimeout = config.Duration(50 * time.Millisecond)
			sb := newFakeSandbox(nil)
			req := request(p, sb)
			req.Approver = tt.approver
			res, err := newAgent(t, s).Run(context.Background(), req)
			if err != nil {
				t.Fatalf("Run: %v", err)
			}
			got := res.ToolCalls[0].Approval
			if got != nil && tt.waitEnded {
				if got.DecidedAt.IsZero() {
					t.Errorf("approval.At is zero, want when the wait ended")
				}
				c := *got
				c.DecidedAt = time.Time{}
				got = &c
			}
			if !reflect.DeepEqual(got, tt.wantApproval) {
				t.Errorf("approval = %+v, want %+v", got, tt.wantApproval)
			}
			argvs := sb.argvs()
			result := lastToolResult(t, s.requests()[1])
			if tt.wantArgv == nil {
				if msg, _ := result["error"].(string); len(argvs) != 0 || msg == "" {
					t.Errorf("execs %q, result %v; want nothing run and an error", argvs, result)
				}
				return
			}
			if len(argvs) != 1 || !reflect.DeepEqual(argvs[0], tt.wantArgv) {
				t.Errorf("execs = %q, want %q", argvs, tt.wantArgv)
			}
			if _, ok := result["exit_code"]; !ok || res.ToolCalls[0].Error != "" {
				t.Errorf("result %v, want a command result", result)
			}
			if tt.policy == config.PolicyAsk {
				want := []agent.ApprovalRequest{{JobID: req.JobID, CallID: "sh1", Argv: tt.wantArgv}}
				if !reflect.DeepEqual(asked, want) {
					t.Errorf("approval requests = %+v, want %+v", asked, want)
				}
			}
		})
	}
}

func TestTranscriptBounded(t *testing.T) {
	s := newScript(t,
		toolCalls(100, call{"c1", "print", `{"n": 5000}`}),
		toolCalls(100, call{"c2", "print", `{"n": 5000}`}),
		final("ok"))
	p := csvProfile(t, printTool)
	p.Limits.MaxTranscriptBytes = 8192
	res, err := newAgent(t, s).Run(context.Background(), request(p, newFakeSandbox(nil)))
	if err != nil {
		t.Fatalf("Run: %v", err)
	}
	if len(res.Transcript) > 8192 {
		t.Errorf("transcript is %d bytes, limit 8192", len(res.Transcript))
	}
	lines := transcriptLines(t, res.Transcript)
	last := lines[len(lines)-1]
	if last["type"] != "truncated" || last["dropped_lines"].(float64) < 1 {
		t.Errorf("last line = %v, want the truncation marker", last)
	}
	if res.Outcome != agent.OutcomeCompleted {
		t.Errorf("outcome = %q: a full transcript must not change the run", res.Outcome)
	}
}

func TestReadFilePaging(t *testing.T) {
	content := strings.Repeat("0123456789", 300) // 3000 bytes
	s := newScript(t,
		toolCalls(100, call{"r1", "read_file", `{"path": "big.txt"}`}),
		toolCalls(100, call{"r2", "read_file", `{"path": "big.txt", "offset": 2048}`}),
		toolCalls(100, call{"r3", "read_file", `{"path": "big.txt", "offset": 10, "limit": 5}`}),
		final("ok"))
	p := csvProfile(t)
	p.Limits.MaxOutputBytes = 1024
	_, err := newAgent(t, s).Run(context.Background(), request(p, newFakeSandbox(map[string]string{"big.txt": content})))
	if err != nil {
		t.Fatalf("Run: %v", err)
	}
	reqs := s.requests()
	tests := []struct {
		name          string
		got           map[string]any
		wantContent   string
		wantTruncated bool
	}{
		{name: "first page", got: lastToolResult(t, reqs[1]), wantContent: content[:1024], wantTruncated: true},
		{name: "last page", got: lastToolResult(t, reqs[2]), wantContent: content[2048:], wantTruncated: false},
		{name: "limit", got: lastToolResult(t, reqs[3]), wantContent: content[10:15], wantTruncated: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if tt.got["content"] != tt.wantContent || tt.got["truncated"] != tt.wantTruncated || tt.got["size"] != 3000.0 {
				t.Errorf("result = %v, want %d bytes, truncated %v, size 3000", tt.got, len(tt.wantContent), tt.wantTruncated)
			}
		})
	}
}

func TestInvalidRequests(t *testing.T) {
	badSchema := config.Tool{Name: "bad", Command: []string{"true"}, Parameters: map[string]any{"type": 5}}
	tests := []struct {
		name string
		mod  func(*agent.Request)
	}{
		{name: "no sandbox", mod: func(r *agent.Request) { r.Sandbox = nil }},
		{name: "no model", mod: func(r *agent.Request) { r.Profile.Model.Name = "" }},
		{name: "empty task", mod: func(r *agent.Request) { r.Task = " " }},
		{name: "schema that does not compile", mod: func(r *agent.Request) { r.Profile.Tools = append(r.Profile.Tools, badSchema) }},
		{name: "schema reaching for a file", mod: func(r *agent.Request) {
			// A valid schema on disk: only the refusal to load it makes this fail.
			ref := filepath.Join(t.TempDir(), "schema.json")
			if err := os.WriteFile(ref, []byte(`{"type": "object"}`), 0o600); err != nil {
				t.Fatal(err)
			}
			r.Profile.Tools = append(r.Profile.Tools, config.Tool{Name: "ref", Command: []string{"true"}, Parameters: map[string]any{"$ref": "file://" + ref}})
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := newScript(t)
			req := request(csvProfile(t), newFakeSandbox(nil))
			tt.mod(&req)
			_, err := newAgent(t, s).Run(context.Background(), req)
			if !errors.Is(err, agent.ErrInvalidRequest) {
				t.Errorf("Run error = %v, want ErrInvalidRequest", err)
			}
			if n := len(s.requests()); n != 0 {
				t.Errorf("the endpoint got %d requests, want none", n)
			}
		})
	}
}

func TestNewConfig(t *testing.T) {
	tests := []struct {
		name    string
		cfg     agent.Config
		wantErr bool
	}{
		{name: "defaults", cfg: agent.Config{}},
		{name: "local endpoint without key", cfg: agent.Config{BaseURL: "http://127.0.0.1:8000/v1"}},
		{name: "not http", cfg: agent.Config{BaseURL: "ftp://example.com/v1"}, wantErr: true},
		{name: "no host", cfg: agent.Config{BaseURL: "http:///v1"}, wantErr: true},
		{name: "negative timeout", cfg: agent.Config{RequestTimeout: -time.Second}, wantErr: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := agent.New(tt.cfg)
			if got := errors.Is(err, agent.ErrInvalidConfig); got != tt.wantErr {
				t.Errorf("New error = %v, want ErrInvalidConfig: %v", err, tt.wantErr)
			}
		})
	}
	got := agent.Config{}.WithDefaults()
	if got.BaseURL != agent.DefaultBaseURL || got.RequestTimeout != 120*time.Second || got.MaxRetries != 3 || got.Logger == nil || got.HTTPClient == nil {
		t.Errorf("defaults = %+v", got)
	}
}
