package demomodel_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"sort"
	"strings"
	"sync"
	"testing"

	"go.uber.org/goleak"

	"github.com/boxcar-run/boxcar/examples"
	"github.com/boxcar-run/boxcar/internal/agent"
	"github.com/boxcar-run/boxcar/internal/config"
	"github.com/boxcar-run/boxcar/internal/demomodel"
	"github.com/boxcar-run/boxcar/internal/sandbox"
	"github.com/boxcar-run/boxcar/internal/spawn"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, goleak.IgnoreAnyFunction(spawn.StarterFunc))
}

const table = `file: sales.csv
rows: 12
| column | count | sum | mean | min | max |
|---|---|---|---|---|---|
| units | 12 | 92.00 | 7.67 | 1.00 | 20.00 |
`

// fakeSandbox holds files in memory; its only program is csv_stats (python3), which prints
// stdout or fails with exitCode.
type fakeSandbox struct {
	mu       sync.Mutex
	files    map[string][]byte
	stdout   string
	exitCode int
	argvs    [][]string
}

func (f *fakeSandbox) Exec(_ context.Context, req sandbox.ExecRequest) (sandbox.ExecResult, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.argvs = append(f.argvs, req.Argv)
	if f.exitCode != 0 {
		return sandbox.ExecResult{ExitCode: f.exitCode, Stderr: []byte("Traceback: ValueError: bad row\n")}, nil
	}
	return sandbox.ExecResult{Stdout: []byte(f.stdout)}, nil
}

func (f *fakeSandbox) ReadFile(_ context.Context, name string, _ int64) ([]byte, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if d, ok := f.files[name]; ok {
		return d, nil
	}
	return nil, sandbox.ErrNotFound
}

func (f *fakeSandbox) WriteFile(_ context.Context, name string, data []byte) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.files[name] = bytes.Clone(data)
	return nil
}

func (f *fakeSandbox) List(context.Context, string) ([]sandbox.FileInfo, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []sandbox.FileInfo
	for name, d := range f.files {
		out = append(out, sandbox.FileInfo{Path: name, Size: int64(len(d))})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Path < out[j].Path })
	return out, nil
}

func csvAnalyst(t *testing.T) config.Profile {
	t.Helper()
	cfg, err := config.Parse(examples.Config)
	if err != nil {
		t.Fatal(err)
	}
	p, err := cfg.Profile("csv-analyst")
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func newServer(t *testing.T) *httptest.Server {
	t.Helper()
	srv := httptest.NewServer(demomodel.Handler())
	t.Cleanup(srv.Close)
	return srv
}

// runDemo runs the real agent loop, through the real openai-go client, against the demo model.
func runDemo(t *testing.T, p config.Profile, sb *fakeSandbox) agent.Result {
	t.Helper()
	srv := newServer(t)
	a, err := agent.New(agent.Config{BaseURL: srv.URL + "/v1", HTTPClient: srv.Client(), MaxRetries: -1})
	if err != nil {
		t.Fatal(err)
	}
	res, err := a.Run(context.Background(), agent.Request{
		JobID: "20261202t101500-demo00000000", Profile: p, Task: "Analyse the sales.",
		Inputs: []string{"notes.txt", "sales.csv"}, Sandbox: sb,
	})
	if err != nil {
		t.Fatalf("Run: %v", err)
	}
	return res
}

func TestDemoWritesTheReport(t *testing.T) {
	sb := &fakeSandbox{stdout: table, files: map[string][]byte{"notes.txt": []byte("n"), "sales.csv": examples.SalesCSV}}
	res := runDemo(t, csvAnalyst(t), sb)

	if res.Outcome != agent.OutcomeCompleted || res.FinalMessage != demomodel.FinalMessage {
		t.Errorf("outcome %q, final %q; want completed, %q", res.Outcome, res.FinalMessage, demomodel.FinalMessage)
	}
	var tools []string
	for _, tc := range res.ToolCalls {
		tools = append(tools, tc.Tool)
		if tc.Error != "" {
			t.Errorf("%s failed: %s", tc.Tool, tc.Error)
		}
	}
	if got := strings.Join(tools, ","); got != "list_files,csv_stats,write_file" {
		t.Errorf("tools = %s, want list_files,csv_stats,write_file", got)
	}
	if len(sb.argvs) != 1 || sb.argvs[0][len(sb.argvs[0])-1] != "sales.csv" {
		t.Errorf("execs = %q, want csv_stats on sales.csv (the first CSV listed)", sb.argvs)
	}
	report := string(sb.files[demomodel.ReportPath])
	for _, want := range []string{"# Sales report\n", table, "scripted demo model, not an LLM"} {
		if !strings.Contains(report, want) {
			t.Errorf("report.md lacks %q:\n%s", want, report)
		}
	}
	if res.Model != "gpt-4.1-mini" {
		t.Errorf("model = %q, want the request's model echoed", res.Model)
	}
	want := []string{"chatcmpl-demo-1", "chatcmpl-demo-2", "chatcmpl-demo-3", "chatcmpl-demo-4"}
	if fmt.Sprint(res.ResponseIDs) != fmt.Sprint(want) {
		t.Errorf("response ids = %v, want %v", res.ResponseIDs, want)
	}
	// The worker believes the demo's usage: it is what the bodies would cost (a token for 4
	// bytes), not an implausible report it replaces with its estimate.
	if res.Usage.PromptTokens <= 0 || res.Usage.CompletionTokens <= 0 || res.Usage.TotalTokens != res.Usage.PromptTokens+res.Usage.CompletionTokens || res.Usage.Estimated {
		t.Errorf("usage = %+v, want positive, adding up and not estimated", res.Usage)
	}
}

func TestDemoReportsProblems(t *testing.T) {
	tests := []struct {
		name      string
		sb        *fakeSandbox
		tools     []string // the profile's tools, by name; nil keeps them all
		wantFinal string
		wantCalls int
	}{
		{
			name:      "csv_stats fails",
			sb:        &fakeSandbox{exitCode: 1, files: map[string][]byte{"sales.csv": examples.SalesCSV}},
			wantFinal: "exit code 1",
			wantCalls: 2,
		},
		{
			name:      "no CSV file",
			sb:        &fakeSandbox{files: map[string][]byte{"notes.txt": []byte("n")}},
			wantFinal: "no CSV file",
			wantCalls: 1,
		},
		{
			name:      "a tool is missing from the profile",
			sb:        &fakeSandbox{stdout: table, files: map[string][]byte{"sales.csv": examples.SalesCSV}},
			tools:     []string{"list_files", "write_file"},
			wantFinal: "needs a csv_stats tool",
			wantCalls: 1,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := csvAnalyst(t)
			if tt.tools != nil {
				var kept []config.Tool
				for _, tool := range p.Tools {
					for _, name := range tt.tools {
						if tool.Name == name {
							kept = append(kept, tool)
						}
					}
				}
				p.Tools = kept
			}
			res := runDemo(t, p, tt.sb)
			if res.Outcome != agent.OutcomeCompleted || !strings.Contains(res.FinalMessage, tt.wantFinal) {
				t.Errorf("outcome %q, final %q; want completed with %q", res.Outcome, res.FinalMessage, tt.wantFinal)
			}
			if len(res.ToolCalls) != tt.wantCalls {
				t.Errorf("tool calls = %d, want %d", len(res.ToolCalls), tt.wantCalls)
			}
			if _, ok := tt.sb.files[demomodel.ReportPath]; ok {
				t.Error("a report was written although something failed")
			}
		})
	}
}

func TestDemoHTTP(t *testing.T) {
	srv := newServer(t)
	tests := []struct {
		name       string
		method     string
		path       string
		body       string
		wantStatus int
		wantBody   string
	}{
		{name: "models", method: http.MethodGet, path: "/v1/models", wantStatus: 200, wantBody: `"id":"boxcar-demo"`},
		{name: "chat without /v1", method: http.MethodPost, path: "/chat/completions", body: `{"model":"m","messages":[{"role":"user","content":"hi"}],"tools":[{"type":"function","function":{"name":"list_files"}}]}`, wantStatus: 200, wantBody: `"name":"list_files"`},
		{name: "first turn without tools", method: http.MethodPost, path: "/v1/chat/completions", body: `{"model":"m","messages":[{"role":"user","content":"hi"}]}`, wantStatus: 200, wantBody: `"finish_reason":"stop"`},
		{name: "first turn calls list_files", method: http.MethodPost, path: "/v1/chat/completions", body: `{"model":"m","messages":[{"role":"user","content":"hi"}],"tools":[{"type":"function","function":{"name":"list_files"}}]}`, wantStatus: 200, wantBody: `"finish_reason":"tool_calls"`},
		{name: "bad JSON", method: http.MethodPost, path: "/v1/chat/completions", body: `{`, wantStatus: 400, wantBody: `"type":"invalid_request_error"`},
		{name: "no model", method: http.MethodPost, path: "/v1/chat/completions", body: `{"messages":[{"role":"user","content":"hi"}]}`, wantStatus: 400, wantBody: "model is required"},
		{name: "no messages", method: http.MethodPost, path: "/v1/chat/completions", body: `{"model":"m","messages":[]}`, wantStatus: 400, wantBody: "messages"},
		{name: "streaming", method: http.MethodPost, path: "/v1/chat/completions", body: `{"model":"m","stream":true,"messages":[{"role":"user","content":"hi"}]}`, wantStatus: 400, wantBody: "stream"},
		{name: "unknown path", method: http.MethodGet, path: "/v1/embeddings", wantStatus: 404, wantBody: "no route"},
		{name: "wrong method", method: http.MethodGet, path: "/v1/chat/completions", wantStatus: 405, wantBody: "use POST"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			req, err := http.NewRequest(tt.method, srv.URL+tt.path, strings.NewReader(tt.body))
			if err != nil {
				t.Fatal(err)
			}
			resp, err := srv.Client().Do(req)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			body, _ := io.ReadAll(resp.Body)
			if resp.StatusCode != tt.wantStatus || !strings.Contains(string(body), tt.wantBody) {
				t.Errorf("%s %s = %d %s, want %d with %q", tt.method, tt.path, resp.StatusCode, body, tt.wantStatus, tt.wantBody)
			}
			if !json.Valid(body) {
				t.Errorf("body is not JSON: %s", body)
			}
		})
	}
}

// TestScriptAndHold: with a Script the model makes its calls turn by turn, then gives
// FinalMessage, and Hold sees each request it answers with its turn and its body.
func TestScriptAndHold(t *testing.T) {
	var mu sync.Mutex
	var turns []int
	var bodies [][]byte
	script := [][]demomodel.Call{{{Name: "write_file", Args: map[string]string{"path": "notes.md", "content": "scripted"}}}}
	srv := httptest.NewServer(demomodel.HandlerWith(demomodel.Options{Script: script, Hold: func(_ *http.Request, turn int, body []byte) {
		mu.Lock()
		defer mu.Unlock()
		turns, bodies = append(turns, turn), append(bodies, body)
	}}))
	t.Cleanup(srv.Close)
	a, err := agent.New(agent.Config{BaseURL: srv.URL + "/v1", HTTPClient: srv.Client(), MaxRetries: -1})
	if err != nil {
		t.Fatal(err)
	}
	sb := &fakeSandbox{files: map[string][]byte{}}
	res, err := a.Run(context.Background(), agent.Request{JobID: "20261202t101500-demo00000001", Profile: csvAnalyst(t),
		Task: "Write the notes.", Sandbox: sb})
	if err != nil {
		t.Fatalf("Run: %v", err)
	}
	if res.FinalMessage != demomodel.FinalMessage || string(sb.files["notes.md"]) != "scripted" {
		t.Errorf("final %q, notes.md %q; want %q after the script's write_file", res.FinalMessage, sb.files["notes.md"], demomodel.FinalMessage)
	}
	mu.Lock()
	defer mu.Unlock()
	if fmt.Sprint(turns) != "[1 2]" || len(bodies) != 2 || !json.Valid(bodies[1]) || !bytes.Contains(bodies[1], []byte("notes.md")) {
		t.Errorf("Hold saw turns %v and %d bodies; want [1 2], the second request's body with the call in it", turns, len(bodies))
	}
}
