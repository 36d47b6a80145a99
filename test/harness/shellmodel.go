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
	answer := Completion{ID: fmt.Sprintf("chatcmpl-shell-%d", step+1), Model: req.Model, Text: "The shell answered: " + result, Prompt: 20, Complete: 10}
	if step == 0 {
		answer.Calls = []ToolCall{{ID: ShellCallID, Name: "shell", Args: map[string]any{"command": argv}}}
	}
	answer.Write(w)
}
