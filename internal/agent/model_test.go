package agent_test

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/boxcar-run/boxcar/internal/agent"
	"github.com/boxcar-run/boxcar/internal/testnet"
	"github.com/boxcar-run/boxcar/test/harness"
)

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
		// openai-go answers a body null with neither a completion nor an error.
		{name: "body null", replies: []reply{{body: `null`}}, wantErr: agent.ErrModelResponse, wantReqs: 1},
		{name: "body null amid white space", replies: []reply{{body: " null\n"}}, wantErr: agent.ErrModelResponse, wantReqs: 1},
		{name: "body an empty object", replies: []reply{{body: `{}`}}, wantErr: agent.ErrModelResponse, wantReqs: 1},
	}
	sentinels := []error{agent.ErrModelAuth, agent.ErrModelRequest, agent.ErrModelUnavailable, agent.ErrModelResponse}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := newScript(t, tt.replies...)
			res, err := newAgent(t, s).Run(context.Background(), request(csvProfile(t), newFakeSandbox(nil)))
			for _, sentinel := range sentinels {
				if got, want := errors.Is(err, sentinel), errors.Is(tt.wantErr, sentinel); got != want {
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
	a, err := agent.New(agent.Config{BaseURL: "http://" + testnet.ClosedAddr(t) + "/v1", APIKey: testKey, MaxRetries: 1})
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

func TestSecretsStayOut(t *testing.T) {
	s := newScript(t, toolCalls(100, call{"c1", "csv_stats", `{"path":"sales.csv"}`}), apiError(401, "invalid_api_key", "Incorrect API key provided: "+testKey, nil))
	var logs harness.LogBuffer
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

// TestAnswerSizeIsBounded: the client reads an answer's body whole, so the agent bounds it
// (Config.MaxResponseBytes): a body past the bound, an error answer's too, ends the run with
// ErrModelResponse, and one at the bound is read. The bound is set small here; what it holds
// off is an endpoint that sends without end, last case.
func TestAnswerSizeIsBounded(t *testing.T) {
	answer := final(strings.Repeat("a", 64<<10))
	size := int64(len(answer.body))
	tests := []struct {
		name    string
		reply   reply
		limit   int64
		wantErr error // nil: the run completes
	}{
		{name: "answer at the bound", reply: answer, limit: size},
		{name: "answer a byte past the bound", reply: answer, limit: size - 1, wantErr: agent.ErrModelResponse},
		{name: "error answer past the bound", reply: apiError(400, "", strings.Repeat("b", 64<<10), nil), limit: 32 << 10, wantErr: agent.ErrModelResponse},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := newScript(t, tt.reply)
			a := newAgent(t, s, func(c *agent.Config) { c.MaxResponseBytes = tt.limit })
			res, err := a.Run(context.Background(), request(csvProfile(t), newFakeSandbox(nil)))
			switch {
			case tt.wantErr == nil && (err != nil || res.Outcome != agent.OutcomeCompleted):
				t.Fatalf("Run: %v, outcome %q; want an answer of %d bytes read under a bound of %d", err, res.Outcome, size, tt.limit)
			case tt.wantErr != nil && !errors.Is(err, tt.wantErr):
				t.Fatalf("Run: %v, want %v", err, tt.wantErr)
			case tt.wantErr != nil && !strings.Contains(err.Error(), "MaxResponseBytes"):
				t.Errorf("Run: %v; want the error to name the bound", err)
			}
		})
	}

	t.Run("answer without end", func(t *testing.T) {
		var written atomic.Int64
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			_, _ = io.Copy(io.Discard, r.Body)
			w.Header().Set("Content-Type", "application/json")
			_, _ = io.WriteString(w, `{"id":"chatcmpl-endless","choices":[{"message":{"role":"assistant","content":"`)
			chunk := strings.Repeat("a", 64<<10)
			for written.Load() < 100<<20 {
				n, err := io.WriteString(w, chunk)
				written.Add(int64(n))
				if err != nil {
					return
				}
			}
		}))
		t.Cleanup(srv.Close)
		a, err := agent.New(agent.Config{BaseURL: srv.URL + "/v1", APIKey: testKey, HTTPClient: srv.Client(), MaxRetries: -1, MaxResponseBytes: 1 << 20})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := a.Run(context.Background(), request(csvProfile(t), newFakeSandbox(nil))); !errors.Is(err, agent.ErrModelResponse) {
			t.Errorf("Run: %v, want ErrModelResponse", err)
		}
		// What the server got out before the client hung up: the bound and the socket's buffers.
		srv.Close()
		if n := written.Load(); n > 48<<20 {
			t.Errorf("the server wrote %d MiB before the client stopped reading; want about the bound of 1 MiB", n>>20)
		}
	})
}

// TestModelErrorClassifiedByStatus: an endpoint's error answer is classified by its HTTP
// status, whatever its body holds. Servers that are not OpenAI's (TGI, LM Studio, many
// proxies) put a string in "error", not an object, which openai-go fails to decode; once the
// agent took that for "no HTTP response at all" (ErrModelUnavailable, transient): a bad key or
// a request over the context length was retried at every delivery instead of failing at the
// first with model_rejected. The same for an answer of 200 whose body is not a chat
// completion (HTML of a wrong base URL, JSON cut short): it is an unusable answer
// (ErrModelResponse), and its turn counts, as the endpoint answered it.
func TestModelErrorClassifiedByStatus(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name      string
		reply     reply
		wantErr   error
		wantTurns int
	}{
		{name: "401 with a string error", reply: reply{status: 401, body: `{"error":"Invalid API key"}`}, wantErr: agent.ErrModelAuth, wantTurns: 1},
		{name: "403 with a string error", reply: reply{status: 403, body: `{"error":"Forbidden"}`}, wantErr: agent.ErrModelAuth, wantTurns: 1},
		{name: "400 context length as TGI says it", reply: reply{status: 400,
			body: `{"error":"Input validation error: inputs tokens + max_new_tokens must be <= 8192","error_type":"validation"}`},
			wantErr: agent.ErrModelRequest, wantTurns: 1},
		{name: "200 with an HTML body", reply: reply{status: 200, body: `<html><body>Welcome</body></html>`}, wantErr: agent.ErrModelResponse, wantTurns: 1},
		{name: "200 with JSON cut short", reply: reply{status: 200, body: `{"id":"chatcmpl-cut","choices":[{"message":{"role":"assistant","content":"hal`},
			wantErr: agent.ErrModelResponse, wantTurns: 1},
	}
	sentinels := []error{agent.ErrModelAuth, agent.ErrModelRequest, agent.ErrModelUnavailable, agent.ErrModelResponse}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			s := newScript(t, tt.reply, tt.reply, tt.reply)
			res, err := newAgent(t, s).Run(context.Background(), request(csvProfile(t), newFakeSandbox(nil)))
			for _, sentinel := range sentinels {
				if got, want := errors.Is(err, sentinel), errors.Is(tt.wantErr, sentinel); got != want {
					t.Errorf("errors.Is(err, %q) = %v, want %v; err: %v", sentinel, got, want, err)
				}
			}
			if res.Spent.Turns != tt.wantTurns {
				t.Errorf("spent %d turns, want %d: the endpoint answered the request", res.Spent.Turns, tt.wantTurns)
			}
		})
	}
}

// TestModelErrorFieldsBounded: every field of the endpoint's error that goes into the run's
// error (which the runner writes to the job's status, the manifest and the dead letter) is
// bounded and has the API key redacted, its code as its message: once an endpoint (or a proxy
// in front of it) that echoed the key in the code put the key there, and a code of megabytes
// went there whole.
func TestModelErrorFieldsBounded(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		code string
	}{
		{name: "code echoing the key", code: "invalid_api_key:" + testKey},
		{name: "code of a megabyte", code: strings.Repeat("x", 1<<20)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			s := newScript(t, apiError(401, tt.code, "Incorrect API key provided", nil))
			_, err := newAgent(t, s).Run(context.Background(), request(csvProfile(t), newFakeSandbox(nil)))
			if !errors.Is(err, agent.ErrModelAuth) {
				t.Fatalf("Run: %v, want ErrModelAuth", err)
			}
			if strings.Contains(err.Error(), testKey) {
				t.Errorf("the error holds the API key: %s", err)
			}
			if n := len(err.Error()); n > 4<<10 {
				t.Errorf("the error is %d bytes; want the endpoint's words bounded as its message is (300 bytes)", n)
			}
		})
	}
}

// TestAnswerFieldsBounded: what the endpoint says of its answer (the response id, the model
// name, the finish reason) goes into the Result, and from there into the manifest, the
// transcript and the logs: each is bounded, its control characters replaced and the API key
// redacted, as an error's fields are.
func TestAnswerFieldsBounded(t *testing.T) {
	t.Parallel()
	body, _ := json.Marshal(map[string]any{
		"id": "chatcmpl-" + strings.Repeat("i", 1<<20), "object": "chat.completion", "created": 1,
		"model": "m\x1b[2J" + testKey, "choices": []any{map[string]any{"index": 0, "finish_reason": "stop" + strings.Repeat("s", 1<<16),
			"message": map[string]any{"role": "assistant", "content": "done"}}},
	})
	res, err := newAgent(t, newScript(t, reply{body: string(body)})).Run(context.Background(), request(csvProfile(t), newFakeSandbox(nil)))
	if err != nil {
		t.Fatalf("Run: %v", err)
	}
	fields := map[string]string{"model": res.Model}
	if len(res.ResponseIDs) == 1 && len(res.Calls) == 1 {
		fields["response id"], fields["call's response id"] = res.ResponseIDs[0], res.Calls[0].ResponseID
	} else {
		t.Fatalf("%d response ids, %d calls; want 1 each", len(res.ResponseIDs), len(res.Calls))
	}
	for name, v := range fields {
		if len(v) > 256 || strings.Contains(v, testKey) || strings.ContainsRune(v, '\x1b') {
			t.Errorf("the %s is %d bytes: %.80q", name, len(v), v)
		}
	}
	if tr := string(res.Transcript); strings.Contains(tr, strings.Repeat("s", 1024)) || strings.Contains(tr, strings.Repeat("i", 1024)) {
		t.Errorf("the transcript holds the answer's id or finish reason whole")
	}
}
