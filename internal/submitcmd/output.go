package submitcmd

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"

	"github.com/nats-io/nats.go"
	"github.com/spf13/cobra"

	"github.com/boxcar-run/boxcar/internal/cli"
	"github.com/boxcar-run/boxcar/internal/job"
	"github.com/boxcar-run/boxcar/internal/provenance"
	"github.com/boxcar-run/boxcar/internal/queue"
	"github.com/boxcar-run/boxcar/internal/store"
)

// Error codes: with --output json an error is one JSON object on stderr,
// {"code":…,"message":…,"exit_code":…}. The codes are stable; docs/cli.md lists them.
const (
	codeUsage            = "usage"
	codeError            = "error"
	codeNATSUnreachable  = "nats_unreachable"
	codeQueueNotSetUp    = "queue_not_set_up"
	codeUnknownJob       = "unknown_job"
	codeUnknownProfile   = "unknown_profile"
	codeNotGranted       = "profile_not_granted"
	codeNotFound         = "not_found"
	codeTimeout          = "timeout"
	codeInterrupted      = "interrupted"
	codeVerifyFailed     = "verification_failed"
	codeUnknownOutcome   = "outcome_unknown"
	codeNotConfirmed     = "not_confirmed"
	codeApprovalChanged  = "approval_changed"
	codeMisfiled         = "approval_misfiled"
	codeRunBeforeTenants = "run_before_tenants"
	codeNoProfiles       = "no_profiles"
	codeInputTooLarge    = "input_too_large"
	codeNotCommitted     = "not_committed"
)

// kindCodes are the codes an ExitError names itself (its Kind), neither by what it wraps nor by
// its exit code.
var kindCodes = []string{codeNoProfiles, codeUnknownProfile, codeNotGranted, codeInputTooLarge}

// errorCodes maps what an error wraps to its code, first match wins: a new failure mode is a
// new row.
var errorCodes = []struct {
	is   func(error) bool
	code string
}{
	{func(err error) bool { return errors.Is(err, cli.ErrUsage) }, codeUsage},
	{func(err error) bool { return errors.Is(err, errUnknownProfile) }, codeUnknownProfile},
	{func(err error) bool { return errors.Is(err, queue.ErrNotReady) }, codeQueueNotSetUp},
	{func(err error) bool { return errors.Is(err, queue.ErrUnknownJob) }, codeUnknownJob},
	{func(err error) bool { return errors.Is(err, nats.ErrNoServers) }, codeNATSUnreachable},
	{func(err error) bool { return errors.Is(err, store.ErrNotFound) }, codeNotFound},
	{func(err error) bool { return errors.Is(err, provenance.ErrInvalid) }, codeVerifyFailed},
	{func(err error) bool { return errors.Is(err, errUnknownOutcome) }, codeUnknownOutcome},
	{func(err error) bool { return errors.Is(err, queue.ErrApprovalChanged) }, codeApprovalChanged},
	{func(err error) bool { return errors.Is(err, queue.ErrMisfiledApproval) }, codeMisfiled},
	{func(err error) bool { return errors.Is(err, errRunBeforeTenants) }, codeRunBeforeTenants},
	{func(err error) bool { return errors.Is(err, errNotCommitted) }, codeNotCommitted},
}

// exitKinds names the documented exit codes that carry their own meaning.
var exitKinds = map[int]string{
	exitFailed: "job_" + string(job.StateFailed), exitCapped: "job_" + string(job.StateCapped),
	exitRejected: "job_" + string(job.StateRejected), exitCancelled: "job_" + string(job.StateCancelled),
	exitDead: "job_" + string(job.StateDead), exitGaveUp: codeTimeout, exitVerifyFailed: codeVerifyFailed,
	exitUnknown: codeUnknownOutcome, exitNotConfirmed: codeNotConfirmed, exitInterrupted: codeInterrupted,
}

// ErrorCode is the stable code of err for scripts (see the constants above).
func ErrorCode(err error) string {
	var exit *ExitError
	if errors.As(err, &exit) {
		if exit.Kind != "" {
			return exit.Kind
		}
		if k, ok := exitKinds[exit.Code]; ok {
			return k
		}
	}
	for _, row := range errorCodes {
		if row.is(err) {
			return row.code
		}
	}
	return codeError
}

// writeJSONError writes err as one JSON object on w and returns it marked as shown, so main
// does not print it a second time; the message stays in the error for callers of Run.
func writeJSONError(w io.Writer, err error) error {
	code, msg := ExitCode(err)
	if code == 0 {
		return nil
	}
	kind := ErrorCode(err)
	data, _ := json.Marshal(map[string]any{"code": kind, "message": msg, "exit_code": code})
	fmt.Fprintln(w, string(data))
	return &ExitError{Code: code, Msg: msg, Kind: kind, Shown: true}
}

// wantsJSON reports --output json (or -o json) among args, for errors that came before the
// flags were parsed (an unknown flag or command).
func wantsJSON(args []string) bool {
	for i, a := range args {
		switch {
		case a == "--":
			return false
		case a == "--output=json", a == "-o=json", a == "-ojson":
			return true
		case (a == "--output" || a == "-o") && i+1 < len(args) && args[i+1] == "json":
			return true
		}
	}
	return false
}

// outputFlag adds --output/-o to c, checked before the command runs.
func (e *env) outputFlag(c *cobra.Command) {
	c.Flags().StringVarP(&e.output, "output", "o", "text", "output format: `text|json`")
	_ = c.RegisterFlagCompletionFunc("output", cobra.FixedCompletions([]string{"text", "json"}, cobra.ShellCompDirectiveNoFileComp))
	c.PreRunE = func(*cobra.Command, []string) error {
		if e.output != "text" && e.output != "json" {
			return cli.Usagef("--output %q: use text or json", e.output)
		}
		return nil
	}
}

// unknownCommand rewrites cobra's unknown-command error, whose suggestions span lines, as one
// line: a newline in a message is escaped on the terminal (literally "\n").
func unknownCommand(root *cobra.Command, args []string) error {
	if len(args) == 0 {
		return nil
	}
	msg := fmt.Sprintf("unknown command %q for %q", args[0], root.CommandPath())
	if s := root.SuggestionsFor(args[0]); len(s) > 0 {
		msg += fmt.Sprintf("; did you mean %q?", strings.Join(s, `" or "`))
	}
	return cli.Usagef("%s (see `submit --help`)", msg)
}
