package submitcmd

import (
	"context"
	"crypto/ed25519"
	"encoding/json"
	"fmt"
	"path/filepath"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/boxcar-run/boxcar/internal/approvalsig"
	"github.com/boxcar-run/boxcar/internal/cli"
	"github.com/boxcar-run/boxcar/internal/job"
	"github.com/boxcar-run/boxcar/internal/provenance"
	"github.com/boxcar-run/boxcar/internal/queue"
)

// maxReasonBytes bounds the reason of a denial; the model reads it.
const maxReasonBytes = 1000

func (e *env) approvalsCmd() *cobra.Command {
	c := &cobra.Command{
		Use:   "approvals [JOB_ID]",
		Short: `shell commands waiting for a person (policy "ask"), oldest first`,
		Args:  cli.Args(0, 1, "approvals: give at most one JOB_ID"),
		RunE: func(c *cobra.Command, a []string) error {
			jobID := ""
			if len(a) == 1 {
				jobID = a[0]
			}
			return e.approvals(c.Context(), jobID)
		},
	}
	e.common(c, true)
	return c
}

func (e *env) approveCmd() *cobra.Command {
	var key string
	c := &cobra.Command{
		Use:   "approve JOB_ID CALL_ID",
		Short: "let a waiting command run; each request is answered once",
		Long: `Lets a waiting command run. The answer is signed with your approver key (--key FILE,
$BOXCAR_APPROVER_KEY, else the embedded worker's $BOXCAR_HOME/keys/approver/signing.key) and
bound to the exact command and request; the worker runs the command only when the key is in
its approver keyring.`,
		Args: cli.Args(2, 2, "approve: give JOB_ID and CALL_ID (`submit approvals` lists them)"),
		RunE: func(c *cobra.Command, a []string) error {
			return e.decide(c.Context(), "approve", job.DecisionApproved, a[0], a[1], "", key)
		},
	}
	approverKeyFlag(c, &key)
	e.common(c, true)
	return c
}

// approverKeyFlag adds --key, the approver's private key that signs an answer.
func approverKeyFlag(c *cobra.Command, key *string) {
	c.Flags().StringVar(key, "key", "", "approver's ed25519 private key (PEM) that signs the answer (default $BOXCAR_APPROVER_KEY, else $BOXCAR_HOME/keys/approver/signing.key) (`FILE`)")
	_ = c.MarkFlagFilename("key", "key", "pem")
}

// approverKey reads the key that signs answers: flag, else $BOXCAR_APPROVER_KEY, else the
// embedded worker's approver key under BOXCAR_HOME.
func (e *env) approverKey(flag string) (ed25519.PrivateKey, error) {
	path := flag
	if path == "" {
		path = e.getenv("BOXCAR_APPROVER_KEY")
	}
	if path == "" {
		home, err := e.home()
		if err != nil {
			return nil, fmt.Errorf("no --key and no home directory: %w", err)
		}
		path = filepath.Join(home, "keys", "approver", provenance.PrivateKeyFile)
	}
	key, err := provenance.ReadPrivateKeyFile(path)
	if err != nil {
		return nil, fmt.Errorf("approver key: %w (give your key with --key FILE; make one with `submit keygen --out DIR` and add its public key to the worker's approver keyring)", err)
	}
	return key, nil
}

func (e *env) denyCmd() *cobra.Command {
	var reason, key string
	c := &cobra.Command{
		Use:   "deny JOB_ID CALL_ID",
		Short: "refuse a waiting command; the model is told the reason",
		Long: `Refuses a waiting command; the model is told the reason. No answer within the profile's
approval_timeout means denied.`,
		Args: cli.Args(2, 2, "deny: give JOB_ID and CALL_ID (`submit approvals` lists them)"),
		RunE: func(c *cobra.Command, a []string) error {
			return e.decide(c.Context(), "deny", job.DecisionDenied, a[0], a[1], reason, key)
		},
	}
	c.Flags().StringVar(&reason, "reason", "", "why the command is refused; the model is told (`TEXT`)")
	approverKeyFlag(c, &key)
	e.common(c, true)
	return c
}

// approvals lists the shell commands waiting for a person, oldest first.
func (e *env) approvals(ctx context.Context, jobID string) error {
	nc, q, err := e.connect(ctx)
	if err != nil {
		return err
	}
	defer nc.Close()
	pending, _, err := q.PendingApprovals(ctx, jobID)
	if err != nil {
		return fmt.Errorf("approvals: %w", err)
	}
	if e.json() {
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
		printf(tw, "%s\t%s\t%s\t%s\n", a.JobID, a.CallID, a.ExpiresAt.Sub(now).Round(time.Second), argv)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintln(e.stderr, "answer with `submit approve JOB_ID CALL_ID` or `submit deny JOB_ID CALL_ID --reason TEXT`")
	return nil
}

// decide answers one approval request. A request is answered once: a second answer, or one
// after the request expired, fails with a message that says what happened instead.
func (e *env) decide(ctx context.Context, name string, d job.Decision, jobID, callID, reason, keyFile string) error {
	if len(reason) > maxReasonBytes {
		return fmt.Errorf("%s: --reason is %d bytes; keep it under %d", name, len(reason), maxReasonBytes)
	}
	key, err := e.approverKey(keyFile)
	if err != nil {
		return fmt.Errorf("%s: %w", name, err)
	}
	nc, q, err := e.connect(ctx)
	if err != nil {
		return err
	}
	defer nc.Close()
	a, err := q.DecideApproval(ctx, jobID, callID, 0, d, submitter(), reason, approvalsig.Signer(key))
	if err != nil {
		return fmt.Errorf("%s: %w", name, err)
	}
	if e.json() {
		return e.printJSON(a)
	}
	argv, _ := json.Marshal(a.Argv)
	printf(e.stdout, "%s call %s of job %s: %s\n", a.Decision, a.CallID, a.JobID, argv)
	return nil
}
