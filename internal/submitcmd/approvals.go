package submitcmd

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"text/tabwriter"
	"time"

	"github.com/boxcar-run/boxcar/internal/queue"
)

// maxReasonBytes bounds the reason of a denial; the model reads it.
const maxReasonBytes = 1000

// approvals lists the shell commands waiting for a person, oldest first.
func (e *env) approvals(ctx context.Context, args []string) error {
	fs := e.flags("approvals")
	rest, err := e.parse(fs, args)
	if err != nil {
		return err
	}
	if len(rest) > 1 {
		return errors.New("approvals: give at most one JOB_ID")
	}
	jobID := ""
	if len(rest) == 1 {
		jobID = rest[0]
	}
	nc, q, err := e.connect(ctx)
	if err != nil {
		return err
	}
	defer nc.Close()
	pending, err := q.PendingApprovals(ctx, jobID)
	if err != nil {
		return fmt.Errorf("approvals: %w", err)
	}
	if e.output == "json" {
		if pending == nil {
			pending = []queue.Approval{}
		}
		return e.printJSON(map[string]any{"approvals": pending})
	}
	if len(pending) == 0 {
		fmt.Fprintln(e.stdout, "no commands are waiting for approval")
		return nil
	}
	tw := tabwriter.NewWriter(e.stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "JOB_ID\tCALL_ID\tEXPIRES IN\tCOMMAND")
	now := time.Now()
	for _, a := range pending {
		argv, _ := json.Marshal(a.Argv) // unambiguous: one JSON string per argument
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", a.JobID, a.CallID, a.ExpiresAt.Sub(now).Round(time.Second), argv)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintln(e.stderr, "answer with `submit approve JOB_ID CALL_ID` or `submit deny JOB_ID CALL_ID --reason TEXT`")
	return nil
}

// decide answers one approval request. A request is answered once: a second answer, or one
// after the request expired, fails with a message that says what happened instead.
func (e *env) decide(ctx context.Context, name string, d queue.Decision, args []string) error {
	fs := e.flags(name)
	var reason string
	if d == queue.DecisionDenied {
		fs.StringVar(&reason, "reason", "", "why the command is refused; the model is told")
	}
	rest, err := e.parse(fs, args)
	if err != nil {
		return err
	}
	if len(rest) != 2 {
		return fmt.Errorf("%s: give JOB_ID and CALL_ID (`submit approvals` lists them)", name)
	}
	if len(reason) > maxReasonBytes {
		return fmt.Errorf("%s: --reason is %d bytes; keep it under %d", name, len(reason), maxReasonBytes)
	}
	nc, q, err := e.connect(ctx)
	if err != nil {
		return err
	}
	defer nc.Close()
	a, err := q.DecideApproval(ctx, rest[0], rest[1], d, submitter(), reason)
	if err != nil {
		return fmt.Errorf("%s: %w", name, err)
	}
	if e.output == "json" {
		return e.printJSON(a)
	}
	argv, _ := json.Marshal(a.Argv)
	fmt.Fprintf(e.stdout, "%s call %s of job %s: %s\n", a.Decision, a.CallID, a.JobID, argv)
	return nil
}
