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

// profileNeed is what one job asks of its profile: the profile, by name, and room for its
// inputs, their bytes together. where names the job in an error ("" for run's one job).
type profileNeed struct {
	profile    string
	inputBytes int64
	where      string
}

// checkProfile refuses, before anything is uploaded, a profile that no live worker defines or
// grants to the tenant, and inputs that no live worker's profile takes (its max_input_bytes):
// the worker would fail that job as input_too_large once it was uploaded. When no worker has
// published its profiles, or NATS cannot say, it warns and lets the jobs through: the worker
// rejects them anyway.
func (e *env) checkProfile(ctx context.Context, q *queue.Client, needs ...profileNeed) error {
	cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	entries, err := q.LiveProfiles(cctx)
	if err != nil {
		printf(e.stderr, "submit: could not check the profile against the live workers (%v); submitting anyway\n", err)
		return nil
	}
	all := liveProfiles(entries)
	granted := grantedTo(all, e.tenant())
	for _, n := range needs {
		if err := e.checkGranted(all, granted, n.profile); err != nil {
			return err
		}
	}
	for _, n := range needs {
		if room := inputRoom(entries, e.tenant(), n.profile); room > 0 && n.inputBytes > room {
			where := "run: "
			if n.where != "" {
				where += n.where + ": "
			}
			return &ExitError{Code: exitRejected, Kind: codeInputTooLarge, Msg: fmt.Sprintf(
				"%sthe inputs are %d bytes together, over max_input_bytes %d of profile %s on every live worker; give smaller inputs or a profile that takes more (`submit profiles -o json` shows max_input_bytes); nothing was uploaded or submitted",
				where, n.inputBytes, room, n.profile)}
		}
	}
	return nil
}

// inputRoom is the most bytes of inputs a live worker's profile name, granted to tenant, takes:
// a worker hands a job its own profile cannot take to a peer whose can. 0 when a worker does
// not publish it (a worker before max_input_bytes was published): then no check.
func inputRoom(entries []queue.WorkerProfiles, tenant, name string) int64 {
	var room int64
	for _, w := range entries {
		for _, p := range w.Profiles {
			if p.Name != name || !p.GrantedTo(tenant) {
				continue
			}
			if p.MaxInputBytes <= 0 {
				return 0
			}
			room = max(room, p.MaxInputBytes)
		}
	}
	return room
}

// checkGranted refuses a profile no live worker defines, or none grants to the tenant.
func (e *env) checkGranted(all, granted []liveProfile, name string) error {
	if slices.ContainsFunc(granted, func(p liveProfile) bool { return p.Name == name }) {
		return nil
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

func orNone(s string) string {
	if s == "" {
		return "none"
	}
	return s
}
