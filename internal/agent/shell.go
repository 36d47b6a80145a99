package agent

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"strings"
	"time"

	"github.com/boxcar-run/boxcar/internal/config"
	"github.com/boxcar-run/boxcar/internal/job"
)

// Approver asks a person whether a shell command may run (the "ask" policy). Approve blocks
// until an answer or until ctx ends; the agent bounds ctx by the profile's approval timeout.
// An answer that does not approve, an error or no answer in time all mean denied; an error
// wrapping context.DeadlineExceeded means nobody answered in time.
type Approver interface {
	Approve(ctx context.Context, req ApprovalRequest) (Answer, error)
}

// Answer is a person's answer to an ApprovalRequest.
type Answer struct {
	Approved bool
	// By names who answered and At when, as the approvals transport recorded them; the run's
	// record keeps both, so that a reader can tell who let a command through. At may also be
	// set, By not, with an error: when the wait for an answer ended.
	By string
	At time.Time
	// Reason is why a person denied the command; the model is told it, as data.
	Reason string
	// Refused says why an answer came that could not be trusted (unsigned, forged, for
	// another command or request, too late): the command does not run.
	Refused string
}

// ApprovalRequest is one command waiting for a person.
type ApprovalRequest struct {
	JobID  string
	CallID string
	Argv   []string
}

// shellTool is general command execution under the profile's policy:
//
//   - deny: every command is refused;
//   - allowlist: a command runs when its argv matches one of the patterns (argvPattern):
//     the pattern's words, separated by white space, match argv's elements one for one, each
//     word one whole element; a last word "*" matches all the elements left, at least one.
//     Within a word "*" matches any run of characters, "?" one character, and "\" makes the
//     next character literal (a space too). Write the program and its fixed leading arguments
//     literally: "git status", "ls *", "python3 scripts/*.py *";
//   - ask: the Approver decides each command; without one every command is refused.
//
// Commands run as argv, never through a shell. A command given as a string is split on
// whitespace with no quoting, so the model is told to prefer an array.
type shellTool struct {
	runner
	spec            config.Tool
	jobID           string
	approver        Approver
	approvalTimeout time.Duration
	allow           []argvPattern
}

func (t shellTool) Definition() definition {
	desc := "Run a command in the sandbox. It runs without a shell: give argv as an array of " +
		"strings, e.g. [\"ls\", \"-l\"]; a string is split on whitespace with no quoting, pipes, " +
		"redirection or variables. "
	switch t.spec.Policy {
	case config.PolicyAllowlist:
		desc += "Only commands matching one of these patterns run; each word of a pattern matches " +
			"one argv element, * within a word matches anything, and a last word * matches " +
			"all further elements: " + strings.Join(t.spec.Allow, " | ") + "."
	case config.PolicyAsk:
		desc += "A person approves each command; a command that is not approved is refused."
	default:
		desc += "The operator's policy currently refuses every command."
	}
	if t.spec.Description != "" {
		desc = t.spec.Description + " " + desc
	}
	return definition{
		Name:        t.spec.Name,
		Description: desc,
		Parameters: objectParams(map[string]any{
			"command": map[string]any{
				"description": "The command as argv (preferred) or as a whitespace-separated string.",
				"anyOf": []any{
					map[string]any{"type": "array", "items": map[string]any{"type": "string"}, "minItems": 1},
					map[string]any{"type": "string", "minLength": 1},
				},
			},
		}, "command"),
	}
}

func (t shellTool) Call(ctx context.Context, callID string, raw json.RawMessage) result {
	var args struct {
		Command json.RawMessage `json:"command"`
	}
	if err := json.Unmarshal(raw, &args); err != nil {
		return failure("invalid arguments: %v", err)
	}
	var argv []string
	var line string
	if err := json.Unmarshal(args.Command, &line); err == nil {
		argv = strings.Fields(line)
	} else if err := json.Unmarshal(args.Command, &argv); err != nil {
		return failure("invalid arguments: command must be an array of strings or a string")
	}
	if len(argv) == 0 || argv[0] == "" {
		return failure("invalid arguments: command is empty")
	}
	for _, a := range argv {
		if strings.ContainsRune(a, 0) {
			return failure("invalid arguments: command contains a NUL byte")
		}
	}
	start := time.Now()
	refused, approval := t.decide(ctx, callID, argv)
	var wait time.Duration
	if t.spec.Policy == config.PolicyAsk && t.approver != nil {
		wait = time.Since(start)
	}
	var res result
	if refused != "" {
		res = failure("refused: %s", refused)
		res.argv = argv
	} else {
		res = t.exec(ctx, argv)
	}
	res.approvalWait = wait
	res.approval = &approval
	return res
}

// decide applies the policy; it returns why the command is refused, or "" to run it, and how
// it was decided.
func (t shellTool) decide(ctx context.Context, callID string, argv []string) (string, job.Approval) {
	switch t.spec.Policy {
	case config.PolicyAllowlist:
		policy := job.Approval{Policy: config.PolicyAllowlist, Decision: job.DecisionApproved}
		for _, p := range t.allow {
			if p.match(argv) {
				return "", policy
			}
		}
		policy.Decision = job.DecisionDenied
		// argv quoted element by element: joined, ["ls x"] and ["ls", "x"] would read alike.
		return fmt.Sprintf("argv %q matches none of the allowed patterns (each word of a pattern matches one element)", argv), policy
	case config.PolicyAsk:
		return t.ask(ctx, callID, argv)
	default:
		return "the operator's policy for this profile refuses shell commands", job.Approval{Policy: config.PolicyDeny, Decision: job.DecisionDenied}
	}
}

// ask lets the Approver decide, within the approval timeout.
func (t shellTool) ask(ctx context.Context, callID string, argv []string) (string, job.Approval) {
	denied := job.Approval{Policy: config.PolicyAsk, Decision: job.DecisionDenied}
	if t.approver == nil {
		return "commands need a person's approval and none can be asked in this run", denied
	}
	actx, cancel := context.WithTimeout(ctx, t.approvalTimeout)
	defer cancel()
	ans, err := t.approver.Approve(actx, ApprovalRequest{JobID: t.jobID, CallID: callID, Argv: argv})
	decided := job.Approval{Policy: config.PolicyAsk, Decision: job.DecisionDenied, DecidedBy: ans.By, DecidedAt: ans.At}
	if decided.DecidedAt.IsZero() {
		decided.DecidedAt = time.Now()
	}
	switch {
	case ans.Refused != "":
		decided.Decision, decided.DecidedBy, decided.Refused = job.DecisionRefused, "", ans.Refused
		return "an answer came that could not be trusted, so the command was refused: " + ans.Refused, decided
	case errors.Is(err, context.DeadlineExceeded) || (err == nil && !ans.Approved && ans.By == "" && actx.Err() != nil):
		// Nobody answered: a name on the record would claim otherwise.
		decided.Decision, decided.DecidedBy = job.DecisionTimedOut, ""
		return fmt.Sprintf("no approval within %s", t.approvalTimeout), decided
	case err != nil:
		decided.DecidedBy = ""
		return fmt.Sprintf("approval failed: %v", err), decided
	case !ans.Approved && ans.Reason != "":
		return "a person denied the command: " + ans.Reason, decided
	case !ans.Approved:
		return "a person denied the command", decided
	}
	decided.Decision = job.DecisionApproved
	return "", decided
}

// argvPattern is one allowlist pattern, matched against argv element by element. Matching
// the elements joined by spaces would let one element pass for several: a program named
// "ls /../../bin/sh" (a path through a folder "ls " the model made) would match "ls *".
type argvPattern struct {
	words []*regexp.Regexp // one per element, in order; the last word "*" is not among them
	rest  bool             // the last word was "*": one or more further elements of any content
}

// compileAllow compiles an allowlist pattern: its words are separated by white space that no
// "\" escapes, and each is a glob (globRegexp) over one argv element.
func compileAllow(pattern string) (argvPattern, error) {
	words := patternWords(pattern)
	if len(words) == 0 {
		return argvPattern{}, errors.New("the pattern is empty; write the program and its fixed arguments, e.g. \"ls *\"")
	}
	var p argvPattern
	if words[len(words)-1] == "*" {
		p.rest, words = true, words[:len(words)-1]
	}
	for _, w := range words {
		re, err := globRegexp(w)
		if err != nil {
			return argvPattern{}, fmt.Errorf("word %q: %w", w, err)
		}
		p.words = append(p.words, re)
	}
	return p, nil
}

// match reports whether argv matches: each word its element, and no element left over unless
// the pattern ends with "*", which then needs at least one ("ls *" does not match "ls").
func (p argvPattern) match(argv []string) bool {
	if n := len(p.words); (p.rest && len(argv) <= n) || (!p.rest && len(argv) != n) {
		return false
	}
	for i, re := range p.words {
		if !re.MatchString(argv[i]) {
			return false
		}
	}
	return true
}

// patternWords splits a pattern on unescaped white space, keeping each word's escapes for
// globRegexp: `cat my\ file` is the words "cat" and `my\ file`.
func patternWords(pattern string) []string {
	var words []string
	var w strings.Builder
	flush := func() {
		if w.Len() > 0 {
			words = append(words, w.String())
			w.Reset()
		}
	}
	for i := 0; i < len(pattern); i++ {
		switch c := pattern[i]; {
		case c == '\\' && i+1 < len(pattern):
			w.WriteByte(c)
			i++
			w.WriteByte(pattern[i])
		case c == ' ' || c == '\t' || c == '\n' || c == '\r':
			flush()
		default:
			w.WriteByte(c)
		}
	}
	flush()
	return words
}

// globRegexp compiles one word of an allowlist pattern: "*" any run of characters, "?" one
// character, "\" escapes the next character; everything else is literal and the match is
// anchored.
func globRegexp(pattern string) (*regexp.Regexp, error) {
	var sb strings.Builder
	sb.WriteString(`(?s)^`)
	for i := 0; i < len(pattern); i++ {
		switch c := pattern[i]; c {
		case '*':
			sb.WriteString(`.*`)
		case '?':
			sb.WriteString(`.`)
		case '\\':
			if i+1 < len(pattern) {
				i++
				sb.WriteString(regexp.QuoteMeta(pattern[i : i+1]))
			} else {
				sb.WriteString(`\\`)
			}
		default:
			sb.WriteString(regexp.QuoteMeta(pattern[i : i+1]))
		}
	}
	sb.WriteString(`$`)
	return regexp.Compile(sb.String())
}
