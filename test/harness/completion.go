package harness

import (
	"encoding/json"
	"net/http"
)

// ToolCall is one tool call in a scripted model's answer; Args is marshalled as its arguments.
type ToolCall struct {
	ID, Name string
	Args     any
}

// Completion is one answer of a scripted OpenAI-compatible model: Text (finish "stop") when
// it has no Calls, else the tool calls (finish "tool_calls"), and the usage it reports.
type Completion struct {
	ID, Model        string
	Text             string
	Calls            []ToolCall
	Prompt, Complete int // tokens
}

// Write sends the completion as a chat-completions response.
func (c Completion) Write(w http.ResponseWriter) {
	message := map[string]any{"role": "assistant", "content": c.Text}
	finish := "stop"
	if len(c.Calls) > 0 {
		calls := make([]map[string]any, 0, len(c.Calls))
		for _, tc := range c.Calls {
			args, _ := json.Marshal(tc.Args)
			calls = append(calls, map[string]any{"id": tc.ID, "type": "function", "function": map[string]any{"name": tc.Name, "arguments": string(args)}})
		}
		message = map[string]any{"role": "assistant", "content": nil, "tool_calls": calls}
		finish = "tool_calls"
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(map[string]any{
		"id": c.ID, "object": "chat.completion", "created": 1764633600, "model": c.Model,
		"choices": []map[string]any{{"index": 0, "message": message, "finish_reason": finish, "logprobs": nil}},
		"usage":   map[string]any{"prompt_tokens": c.Prompt, "completion_tokens": c.Complete, "total_tokens": c.Prompt + c.Complete},
	})
}
