// Package demomodel is a deterministic, scripted stand-in for an OpenAI-compatible chat
// completions endpoint, so that `make demo` runs where no model can be reached. It plays the
// csv-analyst example profile: list_files, then csv_stats on the first CSV file listed, then
// write_file of a Markdown report holding the tool's figures verbatim, then a one-line answer.
//
// It is stateless: every decision comes from the messages of the request, read in the
// tool-result format that internal/agent documents. It is not a model and says so in every
// report it writes.
package demomodel

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"

	"github.com/boxcar-run/boxcar/internal/textcut"
)

// maxBody bounds a request body.
const maxBody = 16 << 20

// ModelID is the model GET /v1/models lists. Chat requests may name any model; it is echoed.
const ModelID = "boxcar-demo"

// ReportPath is the file the demo writes its report to.
const ReportPath = "report.md"

// FinalMessage is the answer after the report was written.
const FinalMessage = "Report written to report.md."

// Handler serves POST /v1/chat/completions (and /chat/completions) and GET /v1/models (and
// /models). Streaming is not supported.
func Handler() http.Handler { return HandlerWith(Options{}) }

// Options change the demo model for a test or a benchmark; the zero value is the demo.
type Options struct {
	// Script, when not nil, is played instead of the csv-analyst one: turn n (1 for a request
	// with no assistant message yet, one more for each) answers with the tool calls
	// Script[n-1], whichever tools the request offers, and a turn past it with FinalMessage.
	Script [][]Call
	// Hold, when set, is called with each chat request the model is about to answer, its turn
	// and its body: it may keep the body, or block, as a model thinking does. A request whose
	// client went away meanwhile gets no answer.
	Hold func(r *http.Request, turn int, body []byte)
}

// Call is one tool call of a Script; Args is marshalled as its arguments.
type Call struct {
	Name string
	Args any
}

// HandlerWith is Handler with the demo changed by o.
func HandlerWith(o Options) http.Handler {
	chat := func(w http.ResponseWriter, r *http.Request) { chatCompletions(w, r, o) }
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/chat/completions", chat)
	mux.HandleFunc("POST /chat/completions", chat)
	mux.HandleFunc("GET /v1/models", models)
	mux.HandleFunc("GET /models", models)
	mux.HandleFunc("/", notFound)
	return mux
}

// notFound answers every other request: 405 on a known path, 404 elsewhere.
func notFound(w http.ResponseWriter, r *http.Request) {
	allow := map[string]string{
		"/v1/chat/completions": http.MethodPost, "/chat/completions": http.MethodPost,
		"/v1/models": http.MethodGet, "/models": http.MethodGet,
	}[r.URL.Path]
	if allow != "" {
		w.Header().Set("Allow", allow)
		writeError(w, http.StatusMethodNotAllowed, fmt.Sprintf("%s %s: use %s", r.Method, r.URL.Path, allow))
		return
	}
	writeError(w, http.StatusNotFound, fmt.Sprintf("no route %s %s: the demo model serves POST /v1/chat/completions and GET /v1/models", r.Method, r.URL.Path))
}

// Request and response shapes: only the fields the demo reads or writes.

type chatRequest struct {
	Model    string          `json:"model"`
	Messages json.RawMessage `json:"messages"`
	Tools    []struct {
		Function struct {
			Name string `json:"name"`
		} `json:"function"`
	} `json:"tools"`
	Stream bool `json:"stream"`
}

type message struct {
	Role       string          `json:"role"`
	Content    json.RawMessage `json:"content"`
	ToolCalls  []toolCall      `json:"tool_calls"`
	ToolCallID string          `json:"tool_call_id"`
}

type toolCall struct {
	ID       string `json:"id"`
	Type     string `json:"type"`
	Function struct {
		Name      string `json:"name"`
		Arguments string `json:"arguments"`
	} `json:"function"`
}

type chatResponse struct {
	ID      string   `json:"id"`
	Object  string   `json:"object"`
	Created int64    `json:"created"`
	Model   string   `json:"model"`
	Choices []choice `json:"choices"`
	Usage   usage    `json:"usage"`
}

type choice struct {
	Index        int             `json:"index"`
	Message      responseMessage `json:"message"`
	Logprobs     *struct{}       `json:"logprobs"`
	FinishReason string          `json:"finish_reason"`
}

type responseMessage struct {
	Role      string     `json:"role"`
	Content   *string    `json:"content"`
	Refusal   *string    `json:"refusal"`
	ToolCalls []toolCall `json:"tool_calls,omitempty"`
}

type usage struct {
	PromptTokens     int64 `json:"prompt_tokens"`
	CompletionTokens int64 `json:"completion_tokens"`
	TotalTokens      int64 `json:"total_tokens"`
}

func chatCompletions(w http.ResponseWriter, r *http.Request, o Options) {
	var req chatRequest
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxBody))
	if err == nil {
		err = json.NewDecoder(bytes.NewReader(body)).Decode(&req)
	}
	if err != nil {
		var tooBig *http.MaxBytesError
		if errors.As(err, &tooBig) {
			writeError(w, http.StatusRequestEntityTooLarge, fmt.Sprintf("request body is larger than %d bytes", maxBody))
			return
		}
		writeError(w, http.StatusBadRequest, "request body is not valid JSON: "+err.Error())
		return
	}
	var msgs []message
	if err := json.Unmarshal(req.Messages, &msgs); err != nil {
		writeError(w, http.StatusBadRequest, "messages must be an array of message objects: "+err.Error())
		return
	}
	switch {
	case req.Model == "":
		writeError(w, http.StatusBadRequest, "model is required")
		return
	case len(msgs) == 0:
		writeError(w, http.StatusBadRequest, "messages must not be empty")
		return
	case req.Stream:
		writeError(w, http.StatusBadRequest, "stream is not supported by the demo model; send stream=false")
		return
	}
	turn := 1
	for _, m := range msgs {
		if m.Role == "assistant" {
			turn++
		}
	}
	if o.Hold != nil {
		o.Hold(r, turn, body)
		if r.Context().Err() != nil {
			return // the client went away while it was held
		}
	}
	msg, finish := answer(o, req, msgs, turn)
	out, _ := json.Marshal(msg)
	resp := chatResponse{
		ID:      fmt.Sprintf("chatcmpl-demo-%d", turn),
		Object:  "chat.completion",
		Created: time.Now().Unix(),
		Model:   req.Model,
		Choices: []choice{{Message: msg, FinishReason: finish}},
		Usage:   usage{PromptTokens: max(1, int64(len(req.Messages)/4)), CompletionTokens: max(1, int64(len(out)/4))},
	}
	resp.Usage.TotalTokens = resp.Usage.PromptTokens + resp.Usage.CompletionTokens
	writeJSON(w, http.StatusOK, resp)
}

// decide is the script. It returns the assistant message and its finish reason.
func decide(msgs []message, offered map[string]bool, turn int) (responseMessage, string) {
	callNamed := map[string]toolCall{}
	var last *message
	for i, m := range msgs {
		for _, tc := range m.ToolCalls {
			callNamed[tc.ID] = tc
		}
		if m.Role == "tool" {
			last = &msgs[i]
		}
	}
	call := func(name string, args any) (responseMessage, string) {
		if !offered[name] {
			return final(fmt.Sprintf("The demo model needs a %s tool, and this request offers none; it stops here.", name))
		}
		b, _ := json.Marshal(args)
		tc := toolCall{ID: fmt.Sprintf("call_demo_%d", turn), Type: "function"}
		tc.Function.Name, tc.Function.Arguments = name, string(b)
		return responseMessage{Role: "assistant", ToolCalls: []toolCall{tc}}, "tool_calls"
	}
	if last == nil {
		return call("list_files", map[string]any{})
	}
	called := callNamed[last.ToolCallID]
	tool := called.Function.Name
	text := contentText(last.Content)
	var res struct {
		Error *string `json:"error"`
		Files []struct {
			Path string `json:"path"`
		} `json:"files"`
		ExitCode int    `json:"exit_code"`
		TimedOut bool   `json:"timed_out"`
		Stdout   string `json:"stdout"`
		Stderr   string `json:"stderr"`
	}
	if err := json.Unmarshal([]byte(text), &res); err != nil {
		return final(fmt.Sprintf("The %s tool returned something the demo model cannot read (%v); it stops here.", or(tool, "last"), err))
	}
	if res.Error != nil {
		return final(fmt.Sprintf("The %s tool failed: %s", or(tool, "last"), *res.Error))
	}
	switch tool {
	case "list_files":
		for _, f := range res.Files {
			if strings.HasSuffix(strings.ToLower(f.Path), ".csv") {
				return call("csv_stats", map[string]string{"path": f.Path})
			}
		}
		return final("There is no CSV file in the working directory, so there is nothing to analyse.")
	case "csv_stats":
		if res.TimedOut {
			return final("The csv_stats tool timed out; no report was written.")
		}
		if res.ExitCode != 0 {
			return final(fmt.Sprintf("The csv_stats tool failed with exit code %d; no report was written. Its error output: %s",
				res.ExitCode, clip(strings.TrimSpace(res.Stderr), 500)))
		}
		var args struct {
			Path string `json:"path"`
		}
		_ = json.Unmarshal([]byte(called.Function.Arguments), &args)
		return call("write_file", map[string]string{"path": ReportPath, "content": report(args.Path, res.Stdout)})
	case "write_file":
		return final(FinalMessage)
	default:
		return final(fmt.Sprintf("The demo model did not expect a result from the %q tool; it stops here.", tool))
	}
}

// answer is turn's message and its finish reason: the script's, or the demo's.
func answer(o Options, req chatRequest, msgs []message, turn int) (responseMessage, string) {
	if o.Script != nil {
		return play(o.Script, turn)
	}
	offered := map[string]bool{}
	for _, t := range req.Tools {
		offered[t.Function.Name] = true
	}
	return decide(msgs, offered, turn)
}

// play is turn's answer in script: its tool calls, or FinalMessage past its end.
func play(script [][]Call, turn int) (responseMessage, string) {
	if turn > len(script) {
		return final(FinalMessage)
	}
	msg := responseMessage{Role: "assistant"}
	for i, c := range script[turn-1] {
		args, _ := json.Marshal(c.Args)
		tc := toolCall{ID: fmt.Sprintf("call_demo_%d_%d", turn, i), Type: "function"}
		tc.Function.Name, tc.Function.Arguments = c.Name, string(args)
		msg.ToolCalls = append(msg.ToolCalls, tc)
	}
	return msg, "tool_calls"
}

// report is the Markdown report: the tool's figures verbatim, and who wrote them.
func report(csvPath, stdout string) string {
	var b strings.Builder
	b.WriteString("# Sales report\n\n")
	fmt.Fprintf(&b, "Figures for `%s`, as computed by the csv_stats tool:\n\n", or(csvPath, "the input file"))
	b.WriteString(strings.TrimRight(stdout, "\n"))
	b.WriteString("\n\n---\n\n")
	b.WriteString("Produced by Boxcar's scripted demo model, not an LLM: it copied the csv_stats output " +
		"above verbatim and drew no conclusions of its own.\n")
	return b.String()
}

func final(text string) (responseMessage, string) {
	return responseMessage{Role: "assistant", Content: &text}, "stop"
}

// contentText returns a message's text whether content is a string or an array of parts.
func contentText(raw json.RawMessage) string {
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return s
	}
	var parts []struct {
		Text string `json:"text"`
	}
	if json.Unmarshal(raw, &parts) == nil {
		var b strings.Builder
		for _, p := range parts {
			b.WriteString(p.Text)
		}
		return b.String()
	}
	return ""
}

func models(w http.ResponseWriter, _ *http.Request) {
	writeJSON(w, http.StatusOK, map[string]any{
		"object": "list",
		"data": []map[string]any{
			{"id": ModelID, "object": "model", "created": 1764633600, "owned_by": "boxcar"},
		},
	})
}

func writeError(w http.ResponseWriter, status int, msg string) {
	writeJSON(w, status, map[string]any{
		"error": map[string]any{"message": msg, "type": "invalid_request_error", "param": nil, "code": nil},
	})
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

func or(s, def string) string {
	if s != "" {
		return s
	}
	return def
}

func clip(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return textcut.Head(s, n) + "…"
}
