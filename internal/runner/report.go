package runner

import (
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/boxcar-run/boxcar/internal/agent"
	"github.com/boxcar-run/boxcar/internal/job"
	"github.com/boxcar-run/boxcar/internal/provenance"
)

// summaryReport is report.md of a run that did not succeed (or succeeded without writing
// anything): what ended it, what it did, and that the transcript holds the rest, then
// whatever the job wrote. A user who opens only the report learns that the run is incomplete
// and why; it is never a silent empty file. from is where body came from ("" for the job's
// report file, fromFinalMessage for the model's last answer). c is what the commit collected:
// what collect left out and what the upload left out since.
func summaryReport(a *attempt, run ran, c provenance.Collected, state job.State, o outcome, body []byte, from string) []byte {
	var b strings.Builder
	fmt.Fprintf(&b, "# Job %s: %s\n\n", a.job.ID, state)
	b.WriteString(headline(a, state, o))
	b.WriteString("\n\n")
	b.WriteString(whatWasDone(run))
	b.WriteString("\n\nThe transcript (transcript.jsonl, beside this report) holds every model turn and tool result; " +
		"the manifest (manifest.json) records the caps, the calls and the digests of every file.\n")
	if c.ReportReason == "report_unreadable" {
		fmt.Fprintf(&b, "\nThe job's report file %s could not be read (%s).\n", a.profile.Report, c.ReportError)
	}
	if n := len(c.Skipped) + c.SkippedMore; n > 0 {
		fmt.Fprintf(&b, "\n%d artifact files or folders were left out; the manifest's collected.skipped names them.\n", n)
	}

	source := "the job's report file " + a.profile.Report
	if from == fromFinalMessage {
		source = "the model's final message"
	}
	fmt.Fprintf(&b, "\n## What the job wrote (%s)\n\n", source)
	if len(body) == 0 {
		fmt.Fprintf(&b, "Nothing: the job wrote no %s and the model gave no final message.\n", a.profile.Report)
	} else {
		b.Write(body)
		if body[len(body)-1] != '\n' {
			b.WriteByte('\n')
		}
	}
	return []byte(b.String())
}

// headline says in one sentence how the run ended.
func headline(a *attempt, state job.State, o outcome) string {
	cause := ""
	if o.err != nil {
		cause = ": " + errorText(o.err)
	}
	switch state {
	case job.StateCapped:
		return fmt.Sprintf("The run was stopped by a cap before the agent finished: %s.", capSentence(a, o.cap))
	case job.StateCancelled:
		return "The job was cancelled while it ran; this is what it had done until then."
	case job.StateFailed:
		return fmt.Sprintf("The run failed (%s)%s.", permanentReason(o.err, "failed"), cause)
	case job.StateDead:
		return fmt.Sprintf("The job ran out of deliveries after attempt %d; its last attempt ended%s.", a.d.Attempt, cause)
	case job.StateSucceeded:
		return "The agent finished, but left no report: no report file and an empty final message."
	}
	return fmt.Sprintf("The run ended %s%s.", state, cause)
}

// capSentences says, for each cap that can end a job capped (its status's and manifest's cap,
// boxcar_cap_hits_total's label), what stopped the run and the bound's value: the one list of
// the caps, which docs/operations.md's is held to (TestDocsNameEveryCap).
var capSentences = map[string]func(a *attempt) string{
	agent.CapMaxTurns: func(a *attempt) string {
		return fmt.Sprintf("max_turns, %d model turns over all attempts", a.limits.MaxTurns)
	},
	agent.CapMaxToolCalls: func(a *attempt) string {
		return fmt.Sprintf("max_tool_calls, %d tool calls over all attempts", a.limits.MaxToolCalls)
	},
	agent.CapMaxTokens: func(a *attempt) string {
		return fmt.Sprintf("max_tokens, %d tokens over all attempts", a.limits.MaxTokens)
	},
	agent.CapJobTimeout: func(a *attempt) string {
		return fmt.Sprintf("job_timeout, %s", time.Duration(a.limits.JobTimeout))
	},
	agent.CapAnswerLength: func(a *attempt) string {
		limit := "the model's own limit"
		if n := a.profile.Model.MaxCompletionTokens; n > 0 {
			limit = fmt.Sprintf("max_completion_tokens, %d", n)
		}
		return fmt.Sprintf("answer_length: the model's last answer was cut at its length limit (%s)", limit)
	},
	agent.CapMaxConversationBytes: func(a *attempt) string {
		return fmt.Sprintf("max_conversation_bytes, %d bytes of the model's answers and tool results in the attempt's conversation", a.limits.MaxConversationBytes)
	},
	capBudgetExhausted: func(*attempt) string {
		return "budget_exhausted: the tenant's daily_tokens were spent"
	},
	capDisk: func(a *attempt) string {
		return fmt.Sprintf("disk: the workdir passed its bound (sandbox.disk, %s) and the sandbox was evicted", a.profile.Sandbox.Disk)
	},
}

// capSentence names the cap that stopped a run and its value.
func capSentence(a *attempt, c string) string {
	if say, ok := capSentences[c]; ok {
		return say(a)
	}
	return c
}

// whatWasDone sums up the budget spent and the tool calls of this attempt.
func whatWasDone(run ran) string {
	s := spent(run)
	var b strings.Builder
	fmt.Fprintf(&b, "What was done: %d model turns, %d tool calls and %d tokens", s.AllAttempts.Turns, s.AllAttempts.ToolCalls, s.AllAttempts.Tokens)
	if s.AllAttempts != s.ThisAttempt {
		fmt.Fprintf(&b, " over all attempts (%d, %d and %d in this one)", s.ThisAttempt.Turns, s.ThisAttempt.ToolCalls, s.ThisAttempt.Tokens)
	}
	b.WriteString(".")
	if len(run.result.ToolCalls) == 0 {
		return b.String()
	}
	type tally struct{ calls, failed, timedOut int }
	byTool := map[string]*tally{}
	for _, c := range run.result.ToolCalls {
		t := byTool[c.Tool]
		if t == nil {
			t = &tally{}
			byTool[c.Tool] = t
		}
		t.calls++
		switch {
		case c.TimedOut:
			t.timedOut++
		case c.ExitCode != 0 || c.Error != "":
			t.failed++
		}
	}
	tools := make([]string, 0, len(byTool))
	for name := range byTool {
		tools = append(tools, name)
	}
	slices.Sort(tools)
	b.WriteString(" Tool calls of this attempt:")
	for i, name := range tools {
		t := byTool[name]
		sep := ","
		if i == 0 {
			sep = ""
		}
		fmt.Fprintf(&b, "%s %s ×%d", sep, name, t.calls)
		if t.failed > 0 || t.timedOut > 0 {
			fmt.Fprintf(&b, " (%d failed, %d timed out)", t.failed, t.timedOut)
		}
	}
	b.WriteString(".")
	return b.String()
}
