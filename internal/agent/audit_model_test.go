package agent_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/boxcar-run/boxcar/internal/agent"
)

// TestAuditModelErrorBodyShapes: an endpoint's error answer is classified by its HTTP status,
// whatever its body holds. Servers that are not OpenAI's (TGI, LM Studio, many proxies) put a
// string in "error", not an object: openai-go then fails to decode the body, and the agent
// takes the decode error for "no HTTP response at all" (ErrModelUnavailable, transient): a bad
// key or a request over the context length is retried at every delivery instead of failing
// at the first with model_rejected. The same happens to an answer of 200 whose body is not a
// chat completion (HTML of a wrong base URL, JSON cut short): it is reported as the endpoint
// being unreachable, not as an unusable answer (ErrModelResponse), and its turn is not counted
// although the endpoint answered it.
func TestAuditModelErrorBodyShapes(t *testing.T) {
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

// TestAuditModelErrorCodeBounded: the endpoint's error message is cut to 300 bytes and the API
// key is redacted from it, but its "code" goes into the error whole: an endpoint (or a proxy in
// front of it) that echoes the key in the code puts the key in the run's error, which the
// runner writes to the job's status, the manifest and the dead letter; a code of megabytes
// goes there whole too.
func TestAuditModelErrorCodeBounded(t *testing.T) {
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
