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

	"github.com/boxcar-run/boxcar/internal/cli"
	"github.com/boxcar-run/boxcar/internal/queue"
)

// errUnknownProfile marks a profile no live worker defines.
var errUnknownProfile = errors.New("unknown profile")

// liveProfile is one profile as the live workers define it.
type liveProfile struct {
	queue.ProfileInfo
	Workers []string `json:"workers"`
	open    bool     // a worker that knows no tenants defines it
}

// granted reports whether a live worker grants the profile to tenant.
func (p liveProfile) granted(tenant string) bool { return p.open || slices.Contains(p.Tenants, tenant) }

// grantedTo keeps the profiles granted to tenant.
func grantedTo(all []liveProfile, tenant string) []liveProfile {
	return slices.DeleteFunc(slices.Clone(all), func(p liveProfile) bool { return !p.granted(tenant) })
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
				lp.Tenants = nil
				by[p.Name] = lp
			}
			lp.Workers = append(lp.Workers, w.Worker)
			// A worker before tenants grants it to everyone: the merged entry says nothing.
			lp.Tenants = append(lp.Tenants, p.Tenants...)
			if p.GrantedToAll() {
				lp.open = true
			}
		}
	}
	out := make([]liveProfile, 0, len(by))
	for _, lp := range by {
		slices.Sort(lp.Tenants)
		lp.Tenants = slices.Compact(lp.Tenants)
		if lp.open {
			lp.Tenants = nil
		}
		lp.GrantedToNone = !lp.open && len(lp.Tenants) == 0
		out = append(out, *lp)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

func (e *env) profilesCmd() *cobra.Command {
	c := &cobra.Command{
		Use:   "profiles",
		Short: "the profiles the live workers define",
		Long: `Lists the execution profiles the live workers define and grant to the tenant submit acts for,
with their description, caps and how many workers define each. Each worker publishes its profiles in NATS (bucket BOXCAR_PROFILES) at start
and every 30 s; a worker gone for 90 s drops out. Needs NATS only, not the store.`,
		Args: cli.Args(0, 0, "profiles: takes no arguments"),
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
		return &ExitError{Code: 1, Kind: codeNoProfiles, Msg: "profiles: no live worker has published its profiles (is a worker running? workers older than this submit do not publish them)"}
	}
	if err != nil {
		return err
	}
	all := grantedTo(liveProfiles(entries), e.tenant())
	if e.json() {
		return e.printJSON(map[string]any{"tenant": e.tenant(), "profiles": all})
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
	granted := grantedTo(all, e.tenant())
	for _, name := range names {
		if slices.ContainsFunc(granted, func(p liveProfile) bool { return p.Name == name }) {
			continue
		}
		if slices.ContainsFunc(all, func(p liveProfile) bool { return p.Name == name }) {
			mine := make([]string, 0, len(granted))
			for _, p := range granted {
				mine = append(mine, p.Name)
			}
			return &ExitError{Code: exitRejected, Kind: codeNotGranted, Msg: fmt.Sprintf(
				"run: profile %q is not granted to tenant %s; it may run %s (see `submit profiles`); nothing was uploaded or submitted",
				name, e.tenant(), orNone(strings.Join(mine, ", ")))}
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

func orNone(s string) string {
	if s == "" {
		return "none"
	}
	return s
}
