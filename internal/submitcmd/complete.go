package submitcmd

import (
	"context"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/boxcar-run/boxcar/internal/job"
)

// completionWait bounds what a completion may spend asking NATS: a shell waits for it.
const completionWait = 2 * time.Second

// maxCompletions bounds the job ids offered, newest first.
const maxCompletions = 200

// completeJobIDs offers the ids of the jobs in the status bucket, newest first, each with its
// state and profile; never file names.
func (e *env) completeJobIDs(c *cobra.Command, _ []string, prefix string) ([]cobra.Completion, cobra.ShellCompDirective) {
	ctx, cancel := context.WithTimeout(c.Context(), completionWait)
	defer cancel()
	nc, q, err := e.connect(ctx)
	if err != nil {
		return nil, cobra.ShellCompDirectiveNoFileComp
	}
	defer nc.Close()
	all, err := q.ListStatuses(ctx, func(st job.Status) bool { return strings.HasPrefix(st.ID, prefix) })
	if err != nil {
		return nil, cobra.ShellCompDirectiveNoFileComp
	}
	var out []cobra.Completion
	for _, st := range all[:min(len(all), maxCompletions)] {
		out = append(out, cobra.CompletionWithDesc(st.ID, clean(string(st.State)+" "+st.Profile)))
	}
	return out, cobra.ShellCompDirectiveNoFileComp
}

// completeFirstJobID completes a command's first argument, a job id, and nothing after it.
func (e *env) completeFirstJobID(c *cobra.Command, a []string, prefix string) ([]cobra.Completion, cobra.ShellCompDirective) {
	if len(a) > 0 {
		return nil, cobra.ShellCompDirectiveNoFileComp
	}
	return e.completeJobIDs(c, a, prefix)
}

// completeProfiles offers the profiles the live workers define, with their descriptions.
func (e *env) completeProfiles(c *cobra.Command, _ []string, prefix string) ([]cobra.Completion, cobra.ShellCompDirective) {
	ctx, cancel := context.WithTimeout(c.Context(), completionWait)
	defer cancel()
	nc, q, err := e.connect(ctx)
	if err != nil {
		return nil, cobra.ShellCompDirectiveNoFileComp
	}
	defer nc.Close()
	entries, err := q.LiveProfiles(ctx)
	if err != nil {
		return nil, cobra.ShellCompDirectiveNoFileComp
	}
	var out []cobra.Completion
	for _, p := range liveProfiles(entries) {
		if strings.HasPrefix(p.Name, prefix) {
			out = append(out, cobra.CompletionWithDesc(p.Name, clean(p.Description)))
		}
	}
	return out, cobra.ShellCompDirectiveNoFileComp
}

// completeArgs gives every command whose first argument is a job id (its Use says JOB_ID) the
// job-id completion, and every other command without its own completion none, so that
// arguments never complete as file names.
func (e *env) completeArgs(root *cobra.Command) {
	for _, c := range root.Commands() {
		if c.ValidArgsFunction != nil || len(c.ValidArgs) > 0 {
			continue
		}
		_, rest, _ := strings.Cut(c.Use, " ")
		if strings.HasPrefix(strings.TrimLeft(rest, "["), "JOB_ID") {
			c.ValidArgsFunction = e.completeFirstJobID
		} else {
			c.ValidArgsFunction = cobra.NoFileCompletions
		}
	}
}
