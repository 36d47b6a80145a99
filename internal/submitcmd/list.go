package submitcmd

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/boxcar-run/boxcar/internal/cli"
	"github.com/boxcar-run/boxcar/internal/job"
)

// listFlags are the filters and the page of `submit list`.
type listFlags struct {
	states  []string
	profile string
	since   time.Duration
	labels  []string
	limit   int
	before  string
}

func (e *env) listCmd() *cobra.Command {
	var f listFlags
	c := &cobra.Command{
		Use:   "list",
		Short: "the jobs NATS knows, newest first, with filters",
		Long: `Lists the jobs in the status bucket (a job's status is kept for status_ttl after it ends),
newest first, --limit at a time: the last line says how to get the next page (--before ID;
with --output json the object's "next"). Filters combine: every --label must match.`,
		Args: cli.Args(0, 0, "list: takes no arguments; filter with --state, --profile, --since, --label"),
		RunE: func(c *cobra.Command, _ []string) error { return e.list(c.Context(), f) },
	}
	fs := c.Flags()
	fs.SortFlags = false
	fs.StringSliceVar(&f.states, "state", nil, "only jobs in this `STATE` (repeatable or comma-separated: queued, running, succeeded, …)")
	fs.StringVar(&f.profile, "profile", "", "only jobs of this profile (`NAME`)")
	fs.DurationVar(&f.since, "since", 0, "only jobs queued within this long (`DURATION`, e.g. 2h)")
	fs.StringArrayVar(&f.labels, "label", nil, "only jobs with this label `k=v` (repeatable)")
	fs.IntVar(&f.limit, "limit", 50, "at most this many jobs (`N`)")
	fs.StringVar(&f.before, "before", "", "the page after this job (`ID`, from the previous page)")
	_ = c.RegisterFlagCompletionFunc("state", cobra.FixedCompletions(stateNames(), cobra.ShellCompDirectiveNoFileComp))
	_ = c.RegisterFlagCompletionFunc("profile", e.completeProfiles)
	_ = c.RegisterFlagCompletionFunc("before", e.completeJobIDs)
	e.common(c, true)
	return c
}

func stateNames() []string {
	return []string{"queued", "running", "waiting_approval", "interrupted", "retrying", "succeeded", "capped", "failed", "rejected", "cancelled", "dead"}
}

// filter turns the flags into the test a job's status must pass.
func (f listFlags) filter(now time.Time) (func(job.Status) bool, error) {
	labels := map[string]string{}
	for _, l := range f.labels {
		k, v, ok := strings.Cut(l, "=")
		if !ok {
			return nil, cli.Usagef("list: --label %q: use key=value", l)
		}
		labels[k] = v
	}
	for _, s := range f.states {
		if !slices.Contains(stateNames(), s) {
			return nil, cli.Usagef("list: --state %q is not a state; use one of %s", s, strings.Join(stateNames(), ", "))
		}
	}
	if f.limit < 1 {
		return nil, cli.Usagef("list: --limit %d: give at least 1", f.limit)
	}
	if err := atLeast("list: --since", f.since, 0); err != nil {
		return nil, err
	}
	return func(st job.Status) bool {
		switch {
		case len(f.states) > 0 && !slices.Contains(f.states, string(st.State)),
			f.profile != "" && st.Profile != f.profile,
			f.since > 0 && st.QueuedAt.Before(now.Add(-f.since)):
			return false
		}
		for k, v := range labels {
			if got, ok := st.Labels[k]; !ok || got != v {
				return false
			}
		}
		return true
	}, nil
}

func (e *env) list(ctx context.Context, f listFlags) error {
	keep, err := f.filter(time.Now())
	if err != nil {
		return err
	}
	nc, q, err := e.connect(ctx)
	if err != nil {
		return err
	}
	defer nc.Close()
	all, err := q.ListStatuses(ctx, keep)
	if err != nil {
		return err
	}
	var unlisted draining
	if len(f.states) == 0 || slices.Contains(f.states, string(job.StateQueued)) {
		if unlisted.stream, unlisted.jobs, err = q.SharedWaiting(ctx); err != nil {
			return err
		}
	}
	page, next, err := pageOf(all, f.before, f.limit)
	if err != nil {
		return err
	}
	if e.json() {
		return e.printListJSON(page, next, unlisted)
	}
	defer e.sayUnlisted(unlisted)
	if len(page) == 0 {
		fmt.Fprintln(e.stderr, "no jobs match")
		return nil
	}
	printf(e.stdout, "%-34s %-16s %-16s %-8s %s\n", "ID", "STATE", "PROFILE", "ATTEMPT", "QUEUED")
	for _, st := range page {
		queued := "-"
		if !st.QueuedAt.IsZero() {
			queued = st.QueuedAt.Local().Format(time.DateTime)
		}
		printf(e.stdout, "%-34s %-16s %-16s %-8d %s\n", st.ID, st.State, st.Profile, st.Attempt, queued)
	}
	if next != "" {
		printf(e.stderr, "more: submit list --before %s (with the same filters)\n", next)
	}
	return nil
}

// printListJSON prints a page as one JSON object: the jobs, the id to continue from, and how
// many wait unlisted in the shared job stream.
func (e *env) printListJSON(page []job.Status, next string, unlisted draining) error {
	jobs := make([]map[string]any, 0, len(page))
	for _, st := range page {
		j := statusJSON(st)
		j["profile"] = st.Profile
		if len(st.Labels) > 0 {
			j["labels"] = st.Labels
		}
		jobs = append(jobs, j)
	}
	out := map[string]any{"jobs": jobs}
	if next != "" {
		out["next"] = next
	}
	if unlisted.jobs > 0 {
		out["unlisted_shared"] = unlisted.jobs
	}
	return e.printJSON(out)
}

// pageOf returns up to limit jobs after the one with id before (from the start when empty),
// and the id to continue from when more follow.
func pageOf(all []job.Status, before string, limit int) ([]job.Status, string, error) {
	if before != "" {
		i := slices.IndexFunc(all, func(st job.Status) bool { return st.ID == before })
		if i < 0 {
			return nil, "", cli.Usagef("list: --before %s: no such job among those listed (expired, or other filters)", before)
		}
		all = all[i+1:]
	}
	if len(all) <= limit {
		return all, "", nil
	}
	return all[:limit], all[limit-1].ID, nil
}

// draining is how many of the tenant's jobs wait unlisted in the shared job stream while an
// upgrade drains it (queue.Client.SharedWaiting).
type draining struct {
	stream string
	jobs   uint64
}

// sayUnlisted says, on stderr, that jobs wait unlisted in the shared job stream and how to see
// them: list said "no jobs match" and nothing of them (TestListSaysDrainingJobsAreNotListed).
func (e *env) sayUnlisted(d draining) {
	if d.jobs == 0 {
		return
	}
	what := fmt.Sprintf("%d jobs queued by an older Boxcar wait in the shared job stream %s and are", d.jobs, d.stream)
	if d.jobs == 1 {
		what = "1 job queued by an older Boxcar waits in the shared job stream " + d.stream + " and is"
	}
	printf(e.stderr, "%s not listed, whatever the filters: a tenant may not list that stream, which holds every tenant's jobs; "+
		"`submit status ID` shows one by its id, and each is listed once a worker takes it\n", what)
}
