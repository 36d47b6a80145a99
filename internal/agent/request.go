package agent

// What a run takes (Request), reports while it goes (Event) and gives back (Result, Budget).

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"time"

	"github.com/boxcar-run/boxcar/internal/config"
	"github.com/boxcar-run/boxcar/internal/job"
)

// Request is one job for the agent.
type Request struct {
	JobID string
	// Logger is the job's logger, carrying what names the job (job_id, tenant, attempt): every
	// line of the run goes through it. nil: Config.Logger with job_id.
	Logger *slog.Logger
	// ProfileName names the job's profile among Config.Profiles, whose tools New compiled;
	// Profile.Tools is then not read. Empty: the tools are Profile.Tools, compiled for this run.
	ProfileName string
	// Profile is the job's execution profile, its limits already tightened by the caller.
	// Complete (config.Profile.Complete), as config.Load returns it: Run fills in no default.
	Profile config.Profile
	Task    string
	// Inputs are the workdir-relative names of the input files, listed to the model.
	Inputs  []string
	Sandbox Sandbox
	// Approver decides the shell tool's "ask" policy; nil means every such command is denied.
	Approver Approver
	// Spent is what earlier attempts of the same job already used; it counts against the caps
	// of this run, so a job that is delivered again never gets a fresh budget.
	Spent Budget
	// Progress, when set, is called synchronously before every model request and every tool
	// call; it must be cheap.
	Progress func(Event)
	// Meter, when set, is asked before every model request whether the job may send it, and
	// told the tokens of every answer (a tenant's daily budget). nil: no such check.
	Meter Meter
	// Transcript, when set, receives the transcript as the run goes, line by line, instead of
	// Result.Transcript: a caller that spools it to a file keeps it out of memory. After a
	// write fails nothing more is written; the writer is the one to say why.
	Transcript io.Writer
}

func (r Request) validate() error {
	switch {
	case r.Sandbox == nil:
		return fmt.Errorf("%w: job %s: no Sandbox", ErrInvalidRequest, r.JobID)
	case r.Profile.Model.Name == "":
		return fmt.Errorf("%w: job %s: the profile names no model", ErrInvalidRequest, r.JobID)
	case strings.TrimSpace(r.Task) == "":
		return fmt.Errorf("%w: job %s: the task is empty", ErrInvalidRequest, r.JobID)
	}
	if err := r.Profile.Complete(); err != nil {
		return fmt.Errorf("%w: job %s: %w", ErrInvalidRequest, r.JobID, err)
	}
	return nil
}

// Meter is a budget outside the job's own caps that model requests spend.
type Meter interface {
	// Allow is asked before each model request; an error ends the run with that error, the
	// request unsent.
	Allow(ctx context.Context) error
	// Spend is told the tokens of each answer, once the endpoint reported them.
	Spend(ctx context.Context, tokens int64)
}

// Event kinds.
const (
	// EventModelRequest: a turn's request is about to be sent; Spent counts the turn.
	EventModelRequest = "model_request"
	// EventModelUnavailable: the endpoint was unavailable for the turn's request (no answer,
	// or a 408, 409, 429 or 5xx after the client's retries); Spent no longer counts the
	// turn. The turn is sent again once the Gate lets it, or the run ends.
	EventModelUnavailable = "model_unavailable"
	// EventToolCall: a tool call is about to run; Spent counts it.
	EventToolCall = "tool_call"
)

// Event reports progress: a model request about to be sent or found the endpoint
// unavailable, or a tool call about to run.
type Event struct {
	Kind         string
	Turn         int // the model round trip of this run the event belongs to, from 1
	ToolCalls    int // tool calls of this run so far, this one included
	MaxToolCalls int
	// Tool is the name of the tool called, for tool_call events: one the profile declares, or
	// UnknownTool. What the model sent in its place is only in the transcript.
	Tool string
	// Spent is the job's budget used so far, earlier attempts (Request.Spent) included and
	// counting the request or call this event announces: callers that record it lose nothing
	// when the process dies during that request or call. It only grows, but at
	// EventModelUnavailable, which takes back the turn its EventModelRequest counted.
	Spent Budget
}

// Budget is what a job has used of its caps. A turn counts once its request is sent (one that
// found the endpoint unavailable, with no answer or a 408, 409, 429 or 5xx, does not), a tool
// call once it is answered or started (invalid calls count; calls answered "not run" do
// not), tokens once the endpoint reports them.
type Budget struct {
	Turns     int   `json:"turns"`
	ToolCalls int   `json:"tool_calls"`
	Tokens    int64 `json:"tokens"`
}

// Add returns the sum of two budgets.
func (b Budget) Add(o Budget) Budget {
	return Budget{Turns: b.Turns + o.Turns, ToolCalls: b.ToolCalls + o.ToolCalls, Tokens: b.Tokens + o.Tokens}
}

// Outcome is how a run ended when it ended without an error.
type Outcome string

// Outcomes.
const (
	// OutcomeCompleted: the model answered without calling a tool.
	OutcomeCompleted Outcome = "completed"
	// OutcomeCapped: a cap stopped the run; Result.Cap names it.
	OutcomeCapped Outcome = "capped"
)

// Caps that end a run with OutcomeCapped.
const (
	CapMaxTurns     = "max_turns"
	CapMaxToolCalls = "max_tool_calls"
	CapMaxTokens    = "max_tokens"
	CapJobTimeout   = "job_timeout"
	// CapAnswerLength: the model's last answer stopped at its length limit (finish_reason
	// "length": the profile's max_completion_tokens, or the model's own): a cut answer is not
	// a finished job, though what it wrote is kept.
	CapAnswerLength = "answer_length"
	// CapMaxConversationBytes: what the model's answers and the tool results added to the
	// conversation, which the worker holds and sends back at every turn, passed the profile's
	// max_conversation_bytes (an endpoint answering megabytes each turn, say).
	CapMaxConversationBytes = "max_conversation_bytes"
)

// Result is what a run produced. Run returns it also with an error, holding what was done
// until then; Outcome is only set when the error is nil.
type Result struct {
	Outcome      Outcome
	Cap          string // when capped: CapMaxTurns, CapMaxToolCalls, CapMaxTokens, CapJobTimeout, CapAnswerLength or CapMaxConversationBytes
	FinalMessage string // the model's last answer (its refusal when it only refused)
	Turns        int    // model round trips of this run that got an answer
	ToolCalls    []ToolCall
	Usage        Usage
	Model        string // as reported by the endpoint
	ResponseIDs  []string
	// Calls are the model requests that got an answer, in order, with what each cost.
	Calls []ModelCall
	// Spent is the job's budget used at the end of this run: Request.Spent plus this run's
	// turns (a request still out when ctx ended included; one the endpoint was unavailable
	// for not), tool calls and tokens.
	Spent Budget
	// Transcript is JSONL (see transcript.go), at most Profile.Limits.MaxTranscriptBytes
	// long, ending with a "truncated" line when it was cut; nil when Request.Transcript took
	// it.
	Transcript []byte
}

// UnknownTool stands for a tool name the model sent that the profile does not declare, in
// progress events, tool call records, log lines and, through them, metrics labels and job
// status: model output may hold anything, terminal escapes included, and a label set must
// stay bounded. The transcript keeps the name as sent, as JSON data.
const UnknownTool = "unknown"

// ToolCall records one tool call that counted against max_tool_calls.
type ToolCall struct {
	ID string
	// Tool is the declared tool called, or UnknownTool.
	Tool string
	// ArgsSHA256 is the hex SHA-256 of the arguments as run (an empty string becomes "{}").
	ArgsSHA256 string
	// ExitCode of the command; 0 for file tools; -1 when nothing ran (Error says why).
	ExitCode  int
	TimedOut  bool
	Truncated bool // output was cut for the model or by the sandbox
	Error     string
	Duration  time.Duration
	// Approval is how the shell policy decided the command; nil for other tools and for shell
	// calls refused before the policy (invalid arguments).
	Approval *job.Approval
}

// ModelCall is one model request that got an answer.
type ModelCall struct {
	Turn       int
	ResponseID string
	Usage      Usage
	Duration   time.Duration // from sending the request to its answer, retries included
}

// Usage is the token usage the endpoint reported, summed over the run. Estimated says that
// the figures (of one answer; in a sum, of at least one) are the agent's estimate from the
// bytes sent and received, as the endpoint reported no usage or an implausible one (see
// countUsage).
type Usage struct {
	PromptTokens     int64 `json:"prompt_tokens"`
	CompletionTokens int64 `json:"completion_tokens"`
	TotalTokens      int64 `json:"total_tokens"`
	Estimated        bool  `json:"estimated,omitempty"`
}
