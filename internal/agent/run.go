package agent

import (
	"bytes"
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"

	"github.com/boxcar-run/boxcar/internal/config"
	"github.com/boxcar-run/boxcar/internal/textcut"
)

// errJobTimeout is the cause of the job context's end when Profile.Limits.JobTimeout passes.
var errJobTimeout = errors.New("job timeout")

// Run lets the model work on the request until it answers without calling a tool or a cap
// stops it. The caps: Limits.MaxTurns model round trips; Limits.MaxToolCalls tool calls (every
// call counts, invalid ones too; calls beyond the cap are answered "not run" and the run
// ends); Limits.MaxTokens total tokens, checked before each request; Limits.JobTimeout over
// the whole run, after which Run returns OutcomeCapped with CapJobTimeout and a nil error.
// The first three count Request.Spent too. The tool calls of the last permitted response
// still run, up to the tool call cap: never one call more. Limits.MaxConversationBytes bounds
// this run's conversation: the answer that calls tools or the tool result that passes it ends
// the run with CapMaxConversationBytes, the calls not run answered "not run".
//
// Errors: ErrInvalidRequest before anything ran; ErrModelUnavailable, ErrModelAuth,
// ErrModelRequest or ErrModelResponse from the endpoint (an ErrModelUnavailable in a
// *RetryAfterError when the Gate knows when the endpoint asked to be tried again); sandbox.ErrSandboxLost when a tool
// call finds the sandbox gone from outside (its pod evicted, its workdir removed): the model
// is not asked to go on without it; ctx's error when ctx ends. With an error Run still returns
// the partial Result, transcript included.
func (a *Agent) Run(ctx context.Context, req Request) (Result, error) {
	if err := req.validate(); err != nil {
		return Result{}, err
	}
	p := req.Profile
	tools, err := a.toolset(p, req)
	if err != nil {
		return Result{}, err
	}
	r := &run{
		agent: a,
		req:   req,
		p:     p,
		log:   cmp.Or(req.Logger, a.cfg.Logger.With("job_id", req.JobID)),
		tools: tools,
		tr:    &transcript{limit: p.Limits.MaxTranscriptBytes, w: req.Transcript},
		ids:   map[string]bool{},
	}
	var inMemory *bytes.Buffer
	if req.Transcript == nil {
		inMemory = &bytes.Buffer{}
		r.tr.w = inMemory
	}
	jobCtx, cancel := context.WithTimeoutCause(ctx, time.Duration(p.Limits.JobTimeout), errJobTimeout)
	defer cancel()
	err = r.loop(jobCtx)
	r.res.Spent = req.Spent.Add(r.used)
	switch {
	case err == nil:
	case ctx.Err() != nil:
		if cause := context.Cause(ctx); cause != ctx.Err() { //nolint:errorlint // identity: Cause returns ctx.Err() itself when no cause was given
			err = fmt.Errorf("agent: job %s interrupted: %w: %w", req.JobID, ctx.Err(), cause)
		} else {
			err = fmt.Errorf("agent: job %s interrupted: %w", req.JobID, ctx.Err())
		}
	case errors.Is(err, errJobTimeout):
		r.capped(CapJobTimeout)
		err = nil
	}
	r.finish(err)
	if inMemory != nil {
		r.res.Transcript = inMemory.Bytes()
	}
	return r.res, err
}

// toolset binds the profile's tools to the run: those New compiled for req.ProfileName, or
// req.Profile's own, compiled now, when no name is given.
func (a *Agent) toolset(p config.Profile, req Request) (*toolset, error) {
	ct, ok := a.profiles[req.ProfileName]
	switch {
	case req.ProfileName == "":
		var problems []toolProblem
		ct, problems = compileTools(&a.schemas, p.Tools)
		if len(problems) > 0 {
			errs := make([]error, len(problems))
			for i, pr := range problems {
				errs[i] = fmt.Errorf("%w: job %s: tools[%d].%s (tool %q): %s", ErrInvalidRequest, req.JobID, pr.index, pr.field, pr.tool, pr.msg)
			}
			return nil, errors.Join(errs...)
		}
	case !ok:
		return nil, fmt.Errorf("%w: job %s: profile %q is not one this agent was configured with", ErrInvalidRequest, req.JobID, req.ProfileName)
	}
	return ct.bind(runEnv{sb: req.Sandbox, limits: p.Limits, jobID: req.JobID, approver: req.Approver}), nil
}

// run is the state of one Run.
type run struct {
	agent    *Agent
	req      Request
	p        config.Profile
	log      *slog.Logger
	tools    *toolset
	tr       *transcript
	res      Result
	messages []openai.ChatCompletionMessageParamUnion
	logged   int             // messages already in the transcript
	held     int64           // what the model's answers and the tool results added to messages, in bytes as sent (jsonLen)
	ids      map[string]bool // tool call ids seen, to keep them unique
	used     Budget          // what this run has used (see Budget)
}

// spent is the job's budget used so far: earlier attempts plus this run.
func (r *run) spent() Budget { return r.req.Spent.Add(r.used) }

// call is one tool call of a response, normalised.
type call struct {
	id, name, args string
	custom         bool
}

func (r *run) loop(ctx context.Context) error {
	if sp := r.p.SystemPrompt; strings.TrimSpace(sp) != "" {
		r.messages = append(r.messages, openai.SystemMessage(sp))
	}
	r.messages = append(r.messages, openai.UserMessage(taskMessage(r.req.Task, r.req.Inputs)))
	defs := r.tools.definitions()
	for {
		if ctx.Err() != nil {
			return context.Cause(ctx)
		}
		if c := r.capBeforeRequest(); c != "" {
			r.capped(c)
			return nil
		}
		turn := r.res.Turns + 1
		choice, err := r.complete(ctx, turn, defs)
		if err != nil {
			return err
		}
		msg := choice.Message
		calls := r.normalize(turn, msg.ToolCalls)
		r.messages = append(r.messages, assistantMessage(msg.Content, calls))
		if len(calls) == 0 {
			// Finish reasons differ between servers ("stop" with tool calls, "tool_calls"
			// without): the presence of tool calls decides, but for an answer cut at the
			// model's length limit, which is not the model's last word.
			r.res.FinalMessage = or(msg.Content, msg.Refusal)
			if choice.FinishReason == "length" {
				r.capped(CapAnswerLength)
				return nil
			}
			r.res.Outcome = OutcomeCompleted
			return nil
		}
		// An answer without tool calls ends the run and is never sent back; one with them
		// is, at every turn from now on.
		r.held += answerBytes(msg.Content, calls)
		if r.conversationFull(turn, calls) {
			return nil
		}
		if ended, err := r.runCalls(ctx, turn, calls); ended {
			return err
		}
	}
}

// capBeforeRequest names the cap that forbids the next request, or "" when none does.
func (r *run) capBeforeRequest() string {
	lim := r.p.Limits
	switch spent := r.spent(); {
	case spent.Turns >= lim.MaxTurns:
		return CapMaxTurns
	case spent.Tokens >= lim.MaxTokens:
		return CapMaxTokens
	}
	return ""
}

// runCalls runs the tool calls of one answer in order and reports whether the run ended: a
// cap, the sandbox lost (its error) or the job's context (its cause).
func (r *run) runCalls(ctx context.Context, turn int, calls []call) (bool, error) {
	lim := r.p.Limits
	for i, c := range calls {
		if r.spent().ToolCalls >= lim.MaxToolCalls {
			reason := fmt.Sprintf("not run: the job reached its cap of %d tool calls", lim.MaxToolCalls)
			if n := r.req.Spent.ToolCalls; n > 0 {
				reason += fmt.Sprintf(" (%d of them in earlier attempts)", n)
			}
			r.skip(turn, calls[i:], reason)
			r.capped(CapMaxToolCalls)
			return true, nil
		}
		if err := r.callTool(ctx, turn, c); err != nil {
			r.skip(turn, calls[i+1:], "not run: the sandbox was lost")
			return true, err
		}
		if ctx.Err() != nil {
			r.skip(turn, calls[i+1:], "not run: the job ended")
			return true, context.Cause(ctx)
		}
		if r.conversationFull(turn, calls[i+1:]) {
			return true, nil
		}
	}
	return false, nil
}

// conversationFull reports whether the conversation holds more than max_conversation_bytes,
// and then ends the run capped, answering the calls not run. The answer or tool result that
// passed it is never sent: the endpoint gets at most the cap back, and the worker holds no
// more than the cap and that one addition.
func (r *run) conversationFull(turn int, notRun []call) bool {
	limit := r.p.Limits.MaxConversationBytes
	if r.held <= limit {
		return false
	}
	r.skip(turn, notRun, fmt.Sprintf("not run: the conversation reached its cap of %d bytes (max_conversation_bytes)", limit))
	r.capped(CapMaxConversationBytes)
	r.log.Warn("conversation past its cap; ending the run", "turn", turn, "held_bytes", r.held, "max_conversation_bytes", limit)
	return true
}

// answerBytes is what an answer that calls tools adds to the conversation: its text and its
// calls' ids, names and arguments, each as the request carries it, a JSON string (jsonLen).
func answerBytes(content string, calls []call) int64 {
	n := jsonLen(content)
	for _, c := range calls {
		n += jsonLen(c.id) + jsonLen(c.name) + jsonLen(c.args)
	}
	return int64(n)
}

// complete sends the conversation and returns the model's answer: its message and why it ended.
func (r *run) complete(ctx context.Context, turn int, defs []openai.ChatCompletionToolUnionParam) (openai.ChatCompletionChoice, error) {
	m := r.p.Model
	params := openai.ChatCompletionNewParams{Model: m.Name, Messages: r.messages, Tools: defs}
	if m.Temperature != nil {
		params.Temperature = openai.Float(*m.Temperature)
	}
	if m.TopP != nil {
		params.TopP = openai.Float(*m.TopP)
	}
	if m.Seed != nil {
		params.Seed = openai.Int(*m.Seed)
	}
	if m.MaxCompletionTokens > 0 {
		params.MaxCompletionTokens = openai.Int(m.MaxCompletionTokens)
	}
	r.logRequest(turn, params)
	resp, wire, start, err := r.send(ctx, turn, params)
	if err != nil {
		return openai.ChatCompletionChoice{}, err
	}
	if resp == nil {
		// openai-go decodes a body "null" into no completion and no error: an answer with no
		// choices, which ends the run below with ErrModelResponse.
		resp = &openai.ChatCompletion{}
	}
	r.res.Turns = turn
	// What the endpoint says of its answer goes into the manifest, the transcript and the
	// logs: bounded like a call id (an id of megabytes would make a manifest nothing reads).
	key := r.agent.cfg.APIKey
	id, model := endpointText(resp.ID, key, maxAnswerField), endpointText(resp.Model, key, maxAnswerField)
	r.res.ResponseIDs = append(r.res.ResponseIDs, id)
	if model != "" {
		r.res.Model = model
	}
	u := countUsage(resp.Usage, wire.sent, wire.got)
	if u.Estimated {
		r.log.Warn("model answer without a plausible usage; its tokens are estimated from its bytes", "turn", turn, "response_id", id,
			"reported_total_tokens", resp.Usage.TotalTokens, "estimated_total_tokens", u.TotalTokens)
	}
	r.res.Usage.Estimated = r.res.Usage.Estimated || u.Estimated
	r.res.Usage.PromptTokens += u.PromptTokens
	r.res.Usage.CompletionTokens += u.CompletionTokens
	r.res.Usage.TotalTokens += u.TotalTokens
	r.used.Tokens = r.res.Usage.TotalTokens
	r.res.Calls = append(r.res.Calls, ModelCall{Turn: turn, ResponseID: id, Usage: u, Duration: time.Since(start)})
	if m := r.req.Meter; m != nil {
		m.Spend(ctx, u.TotalTokens)
	}

	line := responseLine{Type: "response", Time: now(), Turn: turn, ID: id, Model: model, Usage: u, DurationMS: sinceMS(start)}
	if len(resp.Choices) == 0 {
		r.tr.add(line)
		return openai.ChatCompletionChoice{}, fmt.Errorf("agent: chat completion %s: %w: no choices", id, ErrModelResponse)
	}
	choice := resp.Choices[0]
	finish := endpointText(choice.FinishReason, key, maxAnswerField)
	line.FinishReason = finish
	if raw := choice.Message.RawJSON(); json.Valid([]byte(raw)) {
		line.Message = json.RawMessage(raw)
	}
	r.tr.add(line)
	r.log.Info("model response", "turn", turn, "response_id", id, "finish_reason", finish,
		"tool_calls", len(choice.Message.ToolCalls), "total_tokens", u.TotalTokens, "duration_ms", sinceMS(start))
	return choice, nil
}

// normalize makes the tool calls of a response usable whatever the server sent: ids that are
// missing, repeated or not a plain token (plainCallID) are replaced by stable ones, arguments that are empty become "{}",
// arguments sent as an object or as a JSON string holding an object become that object.
func (r *run) normalize(turn int, tcs []openai.ChatCompletionMessageToolCallUnion) []call {
	calls := make([]call, 0, len(tcs))
	for i, tc := range tcs {
		c := call{id: tc.ID, name: tc.Function.Name, args: normalizeArgs(tc.Function.Arguments)}
		if tc.Type == "custom" {
			c.name, c.args, c.custom = tc.Custom.Name, "{}", true
		}
		if len(c.name) > 128 {
			c.name = textcut.Head(c.name, 128)
		}
		if !plainCallID(c.id) || r.ids[c.id] {
			c.id = fmt.Sprintf("call_boxcar_%d_%d", turn, i+1)
			for r.ids[c.id] {
				c.id += "_"
			}
		}
		r.ids[c.id] = true
		calls = append(calls, c)
	}
	return calls
}

// plainCallID reports whether a call id, which the model's answer sets, can be kept as it is:
// 1 to 128 letters, digits, '_', '-', '.' or ':', not starting with '-'. Every server's own ids
// are; an id out of a hostile or broken answer (shell syntax, control characters, megabytes)
// would otherwise reach the manifest, the logs, and the approval prompt a person pastes into
// a shell (`submit approve JOB CALL_ID`).
func plainCallID(id string) bool {
	if id == "" || len(id) > 128 || id[0] == '-' || id[0] == '.' || id[0] == ':' {
		return false
	}
	for i := range len(id) {
		switch c := id[i]; {
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9', c == '_', c == '-', c == '.', c == ':':
		default:
			return false
		}
	}
	return true
}

func normalizeArgs(s string) string {
	t := strings.TrimSpace(s)
	if t == "" || t == "null" {
		return "{}"
	}
	if t[0] == '"' {
		var inner string
		if json.Unmarshal([]byte(t), &inner) == nil {
			if in := strings.TrimSpace(inner); strings.HasPrefix(in, "{") {
				return in
			}
		}
	}
	return t
}

// callTool runs one tool call and appends its tool message. It returns the sandbox's loss
// when the call found it gone (sandbox.ErrSandboxLost), which ends the run.
func (r *run) callTool(ctx context.Context, turn int, c call) error {
	r.used.ToolCalls = len(r.res.ToolCalls) + 1
	name := r.tools.declared(c.name)
	r.progress(Event{Kind: EventToolCall, Turn: turn, ToolCalls: len(r.res.ToolCalls) + 1, MaxToolCalls: r.p.Limits.MaxToolCalls, Tool: name, Spent: r.spent()})
	start := time.Now()
	var res result
	if c.custom {
		res = failure("tool %q not found: only function tool calls are supported", c.name)
	} else {
		res = r.tools.call(ctx, c.id, c.name, c.args)
	}
	d := time.Since(start)
	r.answer(turn, c, res, d)
	sum := sha256.Sum256([]byte(c.args))
	r.res.ToolCalls = append(r.res.ToolCalls, ToolCall{
		ID:         c.id,
		Tool:       name,
		ArgsSHA256: hex.EncodeToString(sum[:]),
		ExitCode:   res.exitCode,
		TimedOut:   res.timedOut,
		Truncated:  res.truncated,
		Error:      res.err,
		Duration:   d,
		Approval:   res.approval,
	})
	attrs := []any{"turn", turn, "tool", name, "call_id", c.id, "exit_code", res.exitCode,
		"timed_out", res.timedOut, "truncated", res.truncated, "duration_ms", d.Milliseconds()}
	if name != c.name {
		attrs = append(attrs, "requested_tool", clipText(strconv.QuoteToASCII(c.name), 300))
	}
	if res.err != "" {
		attrs = append(attrs, "tool_error", clipText(res.err, 300))
	}
	if res.detail != nil {
		attrs = append(attrs, "sandbox_error", clipText(res.detail.Error(), maxErrorBytes))
	}
	r.log.Info("tool call", attrs...)
	return res.lost
}

// maxNotRunLines bounds the calls of one answer that skip answers one by one: an answer may
// hold hundreds of thousands of calls (16 MiB of empty ones), and a transcript line each would
// fill the transcript and drop the run's final line.
const maxNotRunLines = 16

// skip answers calls that will not run: the first maxNotRunLines each with its tool message
// and transcript line, the rest counted in one not_run line. Every skip ends the run, so no
// request carries the calls past them unanswered.
func (r *run) skip(turn int, calls []call, reason string) {
	for i, c := range calls {
		if i == maxNotRunLines {
			r.tr.add(notRunLine{Type: "not_run", Time: now(), Turn: turn, Calls: len(calls) - i, Error: reason})
			return
		}
		r.answer(turn, c, failure("%s", reason), 0)
	}
}

// answer appends the tool message of a call and its transcript line.
func (r *run) answer(turn int, c call, res result, d time.Duration) {
	content, err := json.Marshal(res.model)
	if err != nil {
		content, _ = json.Marshal(errorResult{Error: "failed: result not encodable: " + err.Error()})
	}
	r.messages = append(r.messages, openai.ToolMessage(string(content), c.id))
	r.held += int64(jsonLen(string(content)) + jsonLen(c.id)) // as the request carries them
	full := res.full
	if full == nil {
		full = res.model
	}
	line := toolCallLine{Type: "tool_call", Time: now(), Turn: turn, ID: c.id, Tool: c.name, Args: rawJSON(c.args),
		Argv: res.argv, Result: full, ExitCode: res.exitCode, TimedOut: res.timedOut, Truncated: res.truncated,
		DurationMS: d.Milliseconds(), Error: res.err}
	if res.ran {
		line.ExecMS = new(res.execDuration.Milliseconds())
		line.Stdout, line.Stderr = &res.stdout, &res.stderr
	}
	if res.approvalWait > 0 {
		line.ApprovalMS = new(res.approvalWait.Milliseconds())
	}
	r.tr.add(line)
}

func (r *run) capped(cap string) {
	r.res.Outcome = OutcomeCapped
	r.res.Cap = cap
}

func (r *run) progress(e Event) {
	if r.req.Progress != nil {
		r.req.Progress(e)
	}
}

// logRequest writes the request to the transcript: the parameters and tools once, then only
// the messages added since the previous request.
func (r *run) logRequest(turn int, params openai.ChatCompletionNewParams) {
	line := requestLine{Type: "request", Time: now(), Turn: turn}
	if turn == 1 {
		head := params
		head.Messages = nil
		if b, err := json.Marshal(head); err == nil {
			line.Params = b
		}
	}
	for _, m := range r.messages[r.logged:] {
		if b, err := json.Marshal(m); err == nil {
			line.Messages = append(line.Messages, b)
		}
	}
	r.logged = len(r.messages)
	r.tr.add(line)
	r.log.Debug("model request", "turn", turn, "messages", len(r.messages))
}

// logAttempt logs each HTTP attempt that failed, retries included; never headers or bodies.
func (r *run) logAttempt(req *http.Request, next option.MiddlewareNext) (*http.Response, error) {
	start := time.Now()
	res, err := next(req)
	switch {
	case err != nil && req.Context().Err() == nil:
		r.log.Warn("model request attempt failed", "error", err, "duration_ms", sinceMS(start))
	case err == nil && res.StatusCode >= 400:
		r.log.Warn("model request attempt failed", "status", res.StatusCode, "duration_ms", sinceMS(start))
	}
	return res, err
}

// finish closes the transcript and logs the end of the run.
func (r *run) finish(err error) {
	line := finalLine{Type: "final", Time: now(), Outcome: r.res.Outcome, Cap: r.res.Cap, Message: r.res.FinalMessage,
		Turns: r.res.Turns, ToolCalls: len(r.res.ToolCalls), Usage: r.res.Usage, Spent: r.res.Spent}
	attrs := []any{"outcome", r.res.Outcome, "turns", r.res.Turns, "tool_calls", len(r.res.ToolCalls),
		"total_tokens", r.res.Usage.TotalTokens}
	if r.res.Cap != "" {
		attrs = append(attrs, "cap", r.res.Cap)
	}
	if err != nil {
		line.Error = err.Error()
		attrs = append(attrs, "error", err) // returned too; logged here only at debug level
		r.log.Debug("agent run ended", attrs...)
	} else {
		r.log.Info("agent run ended", attrs...)
	}
	r.tr.add(line)
	r.tr.end()
}

// clipText shortens s for a log line.
func clipText(s string, n int) string {
	if len(s) <= n {
		return s
	}
	t, _ := clip([]byte(s), n)
	return t
}

// taskMessage is the first user message: the task and the input files.
func taskMessage(task string, inputs []string) string {
	var b strings.Builder
	b.WriteString(strings.TrimSpace(task))
	if len(inputs) == 0 {
		b.WriteString("\n\nThere are no input files.")
		return b.String()
	}
	b.WriteString("\n\nInput files in the working directory:")
	for _, in := range inputs {
		b.WriteString("\n- ")
		b.WriteString(in)
	}
	return b.String()
}

// assistantMessage is the model's message as it goes back in the conversation, with the
// normalised tool calls so that ids match the tool messages.
func assistantMessage(content string, calls []call) openai.ChatCompletionMessageParamUnion {
	var m openai.ChatCompletionAssistantMessageParam
	if content != "" {
		m.Content.OfString = openai.String(content)
	}
	for _, c := range calls {
		m.ToolCalls = append(m.ToolCalls, openai.ChatCompletionMessageToolCallUnionParam{
			OfFunction: &openai.ChatCompletionMessageFunctionToolCallParam{
				ID:       c.id,
				Function: openai.ChatCompletionMessageFunctionToolCallFunctionParam{Name: c.name, Arguments: c.args},
			},
		})
	}
	return openai.ChatCompletionMessageParamUnion{OfAssistant: &m}
}
