package agent_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/boxcar-run/boxcar/internal/agent"
	"github.com/boxcar-run/boxcar/internal/config"
	"github.com/boxcar-run/boxcar/test/harness"
)

func TestRunHappyPath(t *testing.T) {
	s := newScript(t,
		fixture(t, "openai_list_files.json"),
		fixture(t, "openai_csv_stats.json"),
		fixture(t, "openai_write_file.json"),
		fixture(t, "openai_final.json"),
	)
	var logs harness.LogBuffer
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
			// The usage a tokenizer would report for the arguments (a megabyte is no 100 tokens).
			s := newScript(t, toolCalls(max(100, int64(len(tt.args)/4)), call{"call_1", tt.tool, tt.args}), final("gave up"))
			sb := newFakeSandbox(map[string]string{"sales.csv": salesCSV})
			p := csvProfile(t)
			p.Limits.MaxTokens = 1 << 20 // room for the megabyte of arguments
			res, err := newAgent(t, s).Run(context.Background(), request(p, sb))
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

// plainCallID is what a recorded call id may be: letters, digits, '_', '-', '.' and ':', not
// starting with '-' (a flag when pasted after `submit approve JOB`), at most 128 bytes.
var plainCallID = regexp.MustCompile(`^[A-Za-z0-9_][A-Za-z0-9_.:-]{0,127}$`)

func TestServerQuirks(t *testing.T) {
	tests := []struct {
		name     string
		fixture  string
		wantCall int // tool calls run
	}{
		{name: "finish_reason stop with tool calls (vLLM)", fixture: "vllm_stop_with_tool_calls.json", wantCall: 1},
		{name: "missing and empty ids", fixture: "missing_ids.json", wantCall: 2},
		{name: "duplicate ids", fixture: "duplicate_ids.json", wantCall: 2},
		// Ids with shell syntax, control characters, a leading dash or hundreds of bytes: the
		// id reaches the manifest, logs and the approval prompt (`submit approve JOB CALL_ID`).
		{name: "ids that are no plain token", fixture: "odd_ids.json", wantCall: 5},
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
				if !plainCallID.MatchString(tc.ID) {
					t.Errorf("tool call id %.200q is not a plain token", tc.ID)
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
		{name: "password that does not parse", cfg: agent.Config{BaseURL: "https://u:s3cr%ZZet@host/v1"}, wantErr: true},
		{name: "password with a slash, not http", cfg: agent.Config{BaseURL: "ftp://u:s3cr/et@host/v1"}, wantErr: true},
		{name: "negative timeout", cfg: agent.Config{RequestTimeout: -time.Second}, wantErr: true},
		{name: "negative response bound", cfg: agent.Config{MaxResponseBytes: -1}, wantErr: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := agent.New(tt.cfg)
			if got := errors.Is(err, agent.ErrInvalidConfig); got != tt.wantErr {
				t.Errorf("New error = %v, want ErrInvalidConfig: %v", err, tt.wantErr)
			}
			if err != nil && strings.Contains(err.Error(), "s3cr") {
				t.Errorf("New's error holds the base URL's password: %v", err)
			}
		})
	}
	got := agent.Config{}.WithDefaults()
	if got.BaseURL != agent.DefaultBaseURL || got.RequestTimeout != 120*time.Second || got.MaxRetries != 3 || got.MaxResponseBytes != agent.DefaultMaxResponseBytes || got.Logger == nil || got.HTTPClient == nil {
		t.Errorf("defaults = %+v", got)
	}
}
