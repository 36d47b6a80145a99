package submitcmd

import (
	"bufio"
	"context"
	"crypto/ed25519"
	"encoding/json"
	"fmt"
	"path/filepath"
	"strings"
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
		Args:  jobIDArgs(0, 1, "approvals: give at most one JOB_ID"),
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
	var rev uint64
	var yes bool
	c := &cobra.Command{
		Use:   "approve JOB_ID CALL_ID",
		Short: "let a waiting command run; each request is answered once",
		Long: `Lets a waiting command run. The command is shown before the answer is signed with your
approver key (--key FILE, $BOXCAR_APPROVER_KEY, else the embedded worker's
$BOXCAR_HOME/keys/approver/signing.key), bound to the exact command and request; the worker
runs the command only when the key is in its approver keyring. With --revision (from
` + "`submit approvals`" + `), the answer is refused unless the request is still the one listed.
On a terminal it asks y/N before signing (anything but y or yes signs nothing: exit 10);
without one it signs only with --yes.`,
		Args: jobIDArgs(2, 2, "approve: give JOB_ID and CALL_ID (`submit approvals` lists them)"),
		RunE: func(c *cobra.Command, a []string) error {
			return e.decide(c.Context(), decision{name: "approve", d: job.DecisionApproved, rev: rev, key: key, yes: yes}, a[0], a[1])
		},
	}
	approverKeyFlag(c, &key)
	yesFlag(c, &yes)
	revisionFlag(c, &rev)
	e.common(c, true)
	return c
}

// revisionFlag adds --revision, which binds an answer to the request a person was shown.
func revisionFlag(c *cobra.Command, rev *uint64) {
	c.Flags().Uint64Var(rev, "revision", 0, "answer only the request at this `REVISION` (`submit approvals` lists it); refused if the request changed since")
}

// yesFlag adds --yes, which signs without asking: what a script passes.
func yesFlag(c *cobra.Command, yes *bool) {
	c.Flags().BoolVarP(yes, "yes", "y", false, "sign without asking y/N (needed when stdin is not a terminal)")
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
	var rev uint64
	var yes bool
	c := &cobra.Command{
		Use:   "deny JOB_ID CALL_ID",
		Short: "refuse a waiting command; the model is told the reason",
		Long: `Refuses a waiting command; the model is told the reason. No answer within the profile's
approval_timeout means denied. The command is shown before the answer is signed; with
--revision (from ` + "`submit approvals`" + `), the answer is refused unless the request is still the
one listed. On a terminal it asks y/N before signing (anything but y or yes signs nothing:
exit 10); without one it signs only with --yes.`,
		Args: jobIDArgs(2, 2, "deny: give JOB_ID and CALL_ID (`submit approvals` lists them)"),
		RunE: func(c *cobra.Command, a []string) error {
			return e.decide(c.Context(), decision{name: "deny", d: job.DecisionDenied, rev: rev, reason: reason, key: key, yes: yes}, a[0], a[1])
		},
	}
	c.Flags().StringVar(&reason, "reason", "", "why the command is refused; the model is told (`TEXT`)")
	approverKeyFlag(c, &key)
	yesFlag(c, &yes)
	revisionFlag(c, &rev)
	e.common(c, true)
	return c
}

// listedApproval is a request as `submit approvals --output json` shows it: with the revision
// to pass back with --revision (the bucket's, which the request's body does not hold).
type listedApproval struct {
	queue.Approval
	Revision uint64 `json:"revision"`
}

// approvals lists the shell commands waiting for a person, oldest first, and says which
// entries it skipped: they cannot be the request their key names (queue.ErrMisfiledApproval).
func (e *env) approvals(ctx context.Context, jobID string) error {
	nc, q, err := e.connect(ctx)
	if err != nil {
		return err
	}
	defer nc.Close()
	pending, skipped, err := q.PendingApprovals(ctx, jobID)
	if err != nil {
		return fmt.Errorf("approvals: %w", err)
	}
	if jobID != "" && len(pending) == 0 {
		// Nothing waiting for a job no one knows is a typo, not an empty list.
		if _, err := q.Status(ctx, jobID); err != nil {
			return fmt.Errorf("approvals: %w", unknownJob(err, jobID, q.Tenant()))
		}
	}
	if e.json() {
		out := map[string]any{"approvals": listed(pending)}
		if len(skipped) > 0 {
			out["skipped"] = skipped
		}
		return e.printJSON(out)
	}
	for _, s := range skipped {
		printf(e.stderr, "approvals: skipped %s: %s\n", s.Key, s.Error)
	}
	if len(pending) == 0 {
		fmt.Fprintln(e.stdout, "no commands are waiting for approval")
		return nil
	}
	tw := tabwriter.NewWriter(e.stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "JOB_ID\tCALL_ID\tREVISION\tEXPIRES IN\tCOMMAND")
	now := time.Now()
	for _, a := range pending {
		printf(tw, "%s\t%s\t%d\t%s\t%s\n", a.JobID, a.CallID, a.Revision, a.ExpiresAt.Sub(now).Round(time.Second), shownJSON(a.Argv))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintln(e.stderr, "answer what is listed with `submit approve JOB_ID CALL_ID --revision REVISION` or `submit deny JOB_ID CALL_ID --revision REVISION --reason TEXT`")
	return nil
}

// listed is pending as --output json shows it, [] for none.
func listed(pending []queue.Approval) []listedApproval {
	out := make([]listedApproval, 0, len(pending))
	for _, a := range pending {
		out = append(out, listedApproval{Approval: a, Revision: a.Revision})
	}
	return out
}

// decision is one answer as the command line gives it: the command's name, the decision, the
// revision it is bound to (0: the one read), the reason, the key file and --yes.
type decision struct {
	name   string
	d      job.Decision
	rev    uint64
	reason string
	key    string
	yes    bool
}

// decide answers one approval request. A request is answered once: a second answer, or one
// after the request expired, fails with a message that says what happened instead. The answer
// is bound to a revision of the request, rev (what `submit approvals` listed) or else the one
// read here, and the command of that revision is shown, and confirmed, before it is signed.
func (e *env) decide(ctx context.Context, a decision, jobID, callID string) error {
	if len(a.reason) > maxReasonBytes {
		return fmt.Errorf("%s: --reason is %d bytes; keep it under %d", a.name, len(a.reason), maxReasonBytes)
	}
	key, err := e.approverKey(a.key)
	if err != nil {
		return fmt.Errorf("%s: %w", a.name, err)
	}
	nc, q, err := e.connect(ctx)
	if err != nil {
		return err
	}
	defer nc.Close()
	shown, err := q.Approval(ctx, jobID, callID)
	if err != nil {
		return fmt.Errorf("%s: %w", a.name, err)
	}
	if a.rev == 0 {
		a.rev = shown.Revision
	}
	if shown.Revision == a.rev && shown.Pending(time.Now()) {
		// What is not pending at this revision is refused below, with the reason; nothing to ask.
		printf(e.stderr, "%s: signing %s of call %s of job %s, revision %d: %s\n", a.name, a.d, shown.CallID, shown.JobID, shown.Revision, shownJSON(shown.Argv))
		if err := e.confirm(a.name, a.yes); err != nil {
			return err
		}
	}
	answered, err := q.DecideApproval(ctx, jobID, callID, a.rev, a.d, submitter(), a.reason, approvalsig.Signer(key))
	if err != nil {
		return fmt.Errorf("%s: %w", a.name, err)
	}
	if e.json() {
		return e.printJSON(listedApproval{Approval: answered, Revision: answered.Revision})
	}
	printf(e.stdout, "%s call %s of job %s: %s\n", answered.Decision, answered.CallID, answered.JobID, shownJSON(answered.Argv))
	return nil
}

// shownJSON is a value as a person reads it (a command before answering for it, a transcript's
// tool call): JSON, unambiguous (one string per argument), without the HTML escapes
// json.Marshal writes ('>' as \u003e, '&' as \u0026, '<' as \u003c), which hid the very
// characters that say what a shell line does.
func shownJSON(v any) string {
	var b strings.Builder
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	_ = enc.Encode(v) // what a JSON decoder made, or a []string: always encodes
	return strings.TrimSuffix(b.String(), "\n")
}

// confirm asks the person at the terminal whether to sign what decide showed: the answer lets
// a command run, or not, under their key. yes (--yes) skips it. Without a terminal to ask on it
// refuses unless yes: a script that signs says so.
func (e *env) confirm(name string, yes bool) error {
	if yes {
		return nil
	}
	in := e.input()
	if !isTerminal(in) {
		return cli.Usagef("%s: stdin is not a terminal to ask on; pass --yes to sign without asking", name)
	}
	printf(e.stderr, "%s: sign it? [y/N] ", name)
	line, _ := bufio.NewReader(in).ReadString('\n')
	switch strings.ToLower(strings.TrimSpace(line)) {
	case "y", "yes":
		return nil
	}
	return &ExitError{Code: exitNotConfirmed, Msg: fmt.Sprintf("%s: not confirmed; nothing was signed (answer y to sign, or pass --yes)", name)}
}
