package submitcmd

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/boxcar-run/boxcar/internal/queue"
)

// errUnknownProfile marks a profile no live worker defines.
var errUnknownProfile = errors.New("unknown profile")

// liveProfile is one profile as the live workers define it.
type liveProfile struct {
	queue.ProfileInfo
	Workers []string `json:"workers"`
}

// liveProfiles merges the workers' entries by profile name, sorted by name. Workers that run
// different configs may describe one name differently: the first worker's words are shown.
func liveProfiles(entries []queue.WorkerProfiles) []liveProfile {
	by := map[string]*liveProfile{}
	for _, w := range entries {
		for _, p := range w.Profiles {
			lp, ok := by[p.Name]
			if !ok {
				lp = &liveProfile{ProfileInfo: p}
				by[p.Name] = lp
			}
			lp.Workers = append(lp.Workers, w.Worker)
		}
	}
	out := make([]liveProfile, 0, len(by))
	for _, lp := range by {
		out = append(out, *lp)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

func (e *env) profilesCmd() *cobra.Command {
	c := &cobra.Command{
		Use:   "profiles",
		Short: "the profiles the live workers define",
		Long: `Lists the execution profiles the live workers define, with their description, caps and how many
workers define each. Each worker publishes its profiles in NATS (bucket BOXCAR_PROFILES) at start
and every 30 s; a worker gone for 90 s drops out. Needs NATS only, not the store.`,
		Args: args(0, 0, "profiles: takes no arguments"),
		RunE: func(c *cobra.Command, _ []string) error { return e.profiles(c.Context()) },
	}
	e.common(c, true)
	return c
}

func (e *env) profiles(ctx context.Context) error {
	nc, q, err := e.connect(ctx)
	if err != nil {
		return err
	}
	defer nc.Close()
	entries, err := q.LiveProfiles(ctx)
	if errors.Is(err, queue.ErrNoProfiles) {
		return &ExitError{Code: 1, Kind: "no_profiles", Msg: "profiles: no live worker has published its profiles (is a worker running? workers older than this submit do not publish them)"}
	}
	if err != nil {
		return err
	}
	all := liveProfiles(entries)
	if e.json() {
		return e.printJSON(map[string]any{"profiles": all})
	}
	printf(e.stdout, "%-20s %-8s %-28s %s\n", "PROFILE", "WORKERS", "CAPS (turns/tools/tokens)", "DESCRIPTION")
	for _, p := range all {
		caps := fmt.Sprintf("%d/%d/%d", p.MaxTurns, p.MaxToolCalls, p.MaxTokens)
		if p.JobTimeout > 0 {
			caps += " " + p.JobTimeout.String()
		}
		printf(e.stdout, "%-20s %-8d %-28s %s\n", p.Name, len(p.Workers), caps, p.Description)
	}
	return nil
}

// checkProfile refuses a profile that no live worker defines, before anything is uploaded.
// When no worker has published its profiles, or NATS cannot say, it warns and lets the job
// through: the worker rejects an unknown profile anyway.
func (e *env) checkProfile(ctx context.Context, q *queue.Client, names ...string) error {
	cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	entries, err := q.LiveProfiles(cctx)
	if err != nil {
		fmt.Fprintf(e.stderr, "submit: could not check the profile against the live workers (%v); submitting anyway\n", err)
		return nil
	}
	all := liveProfiles(entries)
	for _, name := range names {
		if slices.ContainsFunc(all, func(p liveProfile) bool { return p.Name == name }) {
			continue
		}
		known := make([]string, 0, len(all))
		for _, p := range all {
			known = append(known, p.Name)
		}
		return &ExitError{Code: exitRejected, Kind: codeUnknownProfile, Msg: fmt.Sprintf(
			"run: unknown profile %q: no live worker defines it; they define %s (see `submit profiles`); nothing was uploaded or submitted",
			name, strings.Join(known, ", "))}
	}
	return nil
}
