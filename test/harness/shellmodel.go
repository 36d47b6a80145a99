package harness

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// ShellCallID is the id ShellModel gives its one tool call.
const ShellCallID = "call_ask_1"

// ShellModel starts a scripted OpenAI-compatible endpoint, closed when the test ends, and
// returns its base URL. It reads the command from the task's line `RUN: ["argv", …]`, calls the
// shell tool with it, and answers with the tool result it got back, verbatim. It keeps no state:
// the step is the number of assistant messages in the request.
func ShellModel(t testing.TB) string {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(serveShell))
	t.Cleanup(srv.Close)
	return srv.URL + "/v1"
}

// shellRequest is the part of a chat-completions request ShellModel reads.
type shellRequest struct {
	Model    string `json:"model"`
	Messages []struct {
		Role    string `json:"role"`
		Content any    `json:"content"`
	} `json:"messages"`
}

// serveShell answers one chat-completions request of ShellModel.
func serveShell(w http.ResponseWriter, r *http.Request) {
	var req shellRequest
	if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	var argv json.RawMessage
	var result string
	step := 0
	for _, m := range req.Messages {
		text, _ := m.Content.(string)
		switch m.Role {
		case "user":
			for _, line := range strings.Split(text, "\n") {
				if cmd, ok := strings.CutPrefix(line, "RUN: "); ok {
					argv = json.RawMessage(cmd)
				}
			}
		case "assistant":
			step++
		case "tool":
			result = text
		}
	}
	message := map[string]any{"role": "assistant", "content": "The shell answered: " + result}
	finish := "stop"
	if step == 0 {
		args, _ := json.Marshal(map[string]any{"command": argv})
		message = map[string]any{"role": "assistant", "content": nil, "tool_calls": []map[string]any{{
			"id": ShellCallID, "type": "function", "function": map[string]any{"name": "shell", "arguments": string(args)},
		}}}
		finish = "tool_calls"
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(map[string]any{
		"id": fmt.Sprintf("chatcmpl-shell-%d", step+1), "object": "chat.completion", "created": 1764633600, "model": req.Model,
		"choices": []map[string]any{{"index": 0, "message": message, "finish_reason": finish, "logprobs": nil}},
		"usage":   map[string]any{"prompt_tokens": 20, "completion_tokens": 10, "total_tokens": 30},
	})
}
