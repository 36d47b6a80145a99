package submitcmd

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/spf13/cobra"

	"github.com/boxcar-run/boxcar/internal/provenance"
	"github.com/boxcar-run/boxcar/internal/store"
)

// maxManifestBytes bounds a manifest read from the store.
const maxManifestBytes = 16 << 20

// errNotCommitted is a job with no manifest in the tenant's store: queued, running, ended
// before it could commit, or no job of the tenant. Nothing was checked, so nothing failed:
// verify said a queued job failed verification (exit 8), as for a tampered run.
var errNotCommitted = errors.New("has no committed run yet")

// notCommitted is errNotCommitted for job id, saying what the store holds of it and how to
// follow it; cmd is the command, what it did instead ends the message (nothing downloaded).
func (e *env) notCommitted(ctx context.Context, st store.Store, cmd, id, instead string) error {
	held := "no object of it (queued or running, ended before it ran, or no job of tenant " + e.tenant() + ")"
	// One object is enough to tell, whatever number a writer of the store put there.
	if objects, _, err := store.ListAtMost(ctx, st, store.RunPrefix(id), 1); err == nil && len(objects) > 0 {
		held = "an attempt's objects and no manifest (still uploading, or it ended before it could commit)"
	}
	return fmt.Errorf("%s: no results for job %s: it %w in %s, which holds %s; `submit status %s` says which, `submit watch %s` follows it until it ends; %s",
		cmd, id, errNotCommitted, st.URL(""), held, id, id, instead)
}

func (e *env) manifestCmd() *cobra.Command {
	c := &cobra.Command{
		Use:   "manifest JOB_ID",
		Short: "what produced the run: inputs, profile, model, tools",
		Long:  "Prints the run's manifest; with --output json, the manifest exactly as stored.",
		Args:  jobIDArgs(1, 1, "manifest: give one JOB_ID"),
		RunE:  func(c *cobra.Command, a []string) error { return e.manifest(c.Context(), a[0]) },
	}
	e.common(c, true)
	return c
}

func (e *env) manifest(ctx context.Context, id string) error {
	st, err := e.openStore(ctx)
	if err != nil {
		return err
	}
	defer closeStore(st)
	data, err := readObject(ctx, st, provenance.ManifestKey(id), maxManifestBytes)
	if errors.Is(err, store.ErrNotFound) {
		if err := e.runBeforeTenants(ctx, st, id); err != nil {
			return fmt.Errorf("manifest: %w", err)
		}
		return e.notCommitted(ctx, st, "manifest", id, "nothing to show")
	}
	if err != nil {
		return fmt.Errorf("manifest: %w", err)
	}
	if e.json() {
		// Exactly the stored bytes, the ones the signature covers, into a pipe or a file, for
		// a verifier. On a terminal they are escaped as every output is: nothing has checked
		// them, and a writer of the store chose them.
		w := e.raw
		if isTerminal(e.raw) {
			w = e.stdout
		}
		_, err := fmt.Fprintln(w, string(data))
		return err
	}
	stmt, err := provenance.Parse(data)
	if err != nil {
		return err
	}
	m := stmt.Predicate
	w := e.stdout
	printf(w, "job:       %s (profile %s, attempt %d)\n", m.Job.ID, m.Job.Profile, m.Attempt)
	printf(w, "outcome:   %s", m.Outcome.State)
	if m.Outcome.Cap != "" {
		printf(w, " (cap %s)", m.Outcome.Cap)
	}
	if m.Outcome.Reason != "" {
		printf(w, " (%s)", m.Outcome.Reason)
	}
	if m.Outcome.Error != "" {
		printf(w, ": %s", m.Outcome.Error)
	}
	printf(w, "\nduration:  %s\n", (time.Duration(m.Timings.DurationMS) * time.Millisecond).String())
	this, all := m.Spent.ThisAttempt, m.Spent.AllAttempts
	printf(w, "spent:     %d turns, %d tool calls, %d tokens in attempt %d; %d turns, %d tool calls, %d tokens in all attempts\n",
		this.Turns, this.ToolCalls, this.Tokens, m.Attempt, all.Turns, all.ToolCalls, all.Tokens)
	for _, in := range m.Inputs {
		printf(w, "input:     %s  sha256:%s  %d bytes\n", in.Name, in.SHA256, in.Size)
	}
	printf(w, "profile:   %s  %s\n", m.Profile.Name, m.Profile.Digest)
	printf(w, "sandbox:   %s %s (cpu %s, memory %s, disk %s, pids %d; %s)\n", m.Sandbox.Backend, m.Sandbox.ID, m.Sandbox.CPU, m.Sandbox.Memory, m.Sandbox.Disk, m.Sandbox.PIDs, m.Sandbox.Isolation)
	if m.Sandbox.Seccomp != "" {
		printf(w, "seccomp:   %s  %s\n", m.Sandbox.Seccomp, m.Sandbox.SeccompDigest)
	}
	printCollected(w, m.Collected)
	printf(w, "model:     %s at %s, %d responses, %d tokens (%d prompt, %d completion)\n", m.Model.Name, m.Model.EndpointHost,
		len(m.Model.ResponseIDs), m.Model.Usage.TotalTokens, m.Model.Usage.PromptTokens, m.Model.Usage.CompletionTokens)
	for i, c := range m.ToolCalls {
		printf(w, "tool %2d:   %-12s exit %d  %4d ms", i+1, c.Tool, c.ExitCode, c.DurationMS)
		if c.TimedOut {
			fmt.Fprint(w, "  timed out")
		}
		if c.Truncated {
			fmt.Fprint(w, "  truncated")
		}
		if a := c.Approval; a.Policy != "" {
			printf(w, "  %s (policy %s", a.Decision, a.Policy)
			if a.DecidedBy != "" {
				printf(w, ", by %s", a.DecidedBy)
			}
			if !a.DecidedAt.IsZero() {
				printf(w, ", at %s", a.DecidedAt.Format(time.RFC3339))
			}
			fmt.Fprint(w, ")")
		}
		if c.Error != "" {
			printf(w, "  error: %s", c.Error)
		}
		fmt.Fprintln(w)
	}
	for _, s := range stmt.Subjects {
		printf(w, "subject:   %s  sha256:%s  %d bytes\n", s.Name, s.SHA256, s.Size)
	}
	printf(w, "worker:    %s, boxcar %s", m.Worker.ID, m.Worker.Version)
	if m.Worker.VCSRevision != "" {
		printf(w, " (%s)", m.Worker.VCSRevision)
	}
	printf(w, ", %s\n", m.Worker.GoVersion)
	return nil
}

// printCollected says where report.md came from when not from the job's report file, and what
// of the artifact folder was left out.
func printCollected(w io.Writer, c provenance.Collected) {
	if c.Report != "" || c.ReportReason != "" {
		printf(w, "report:    from %s", cmp.Or(c.Report, "the job's report file"))
		if c.ReportReason != "" {
			printf(w, " (%s: %s)", c.ReportReason, c.ReportError)
		}
		fmt.Fprintln(w)
	}
	for _, s := range c.Skipped {
		printf(w, "left out:  %s  %s", s.Path, s.Reason)
		if s.Detail != "" {
			printf(w, " (%s)", s.Detail)
		}
		fmt.Fprintln(w)
	}
	if c.SkippedMore > 0 {
		printf(w, "left out:  %d more\n", c.SkippedMore)
	}
}
