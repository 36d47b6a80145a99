package workercmd

import (
	"fmt"
	"io"
	"maps"
	"slices"
	"strconv"
	"strings"

	"github.com/spf13/cobra"

	"github.com/boxcar-run/boxcar/internal/agent"
	"github.com/boxcar-run/boxcar/internal/cli"
	"github.com/boxcar-run/boxcar/internal/config"
)

// checkConfigCmd is `worker check-config FILE`: the checks a worker makes at start of its
// config (the file, its keys and types, the values, every profile's tools) and of what it takes
// from its flags and environment (readStartEnv: NATS_URL, BOXCAR_STORE, the NATS login and TLS
// files, OPENAI_BASE_URL, the CA files, the profiles' secrets), without NATS, the store or a
// sandbox. Exit 0 when a worker would accept them, 1 with every problem found.
func checkConfigCmd(getenv func(string) string, stdout io.Writer) *cobra.Command {
	var conn connFlags
	c := &cobra.Command{
		Use:   "check-config FILE",
		Short: "check a config file and the environment as a starting worker would, without NATS or the store",
		Long: `Checks a worker config file as a starting worker does: YAML syntax, unknown keys, value types,
values and every profile's tools; then what the worker takes from its flags and environment:
NATS_URL and BOXCAR_STORE over the file's URLs, the NATS credential and TLS files (--nats-* or
NATS_*), OPENAI_BASE_URL, the CA files (--s3-ca, BOXCAR_S3_CA, --model-ca, BOXCAR_MODEL_CA) and
each profile's secrets. Give it the flags you give the worker. Each problem is one line: in the
file, file:line:col key.path: message; else it names the flag or variable, never a secret.
Exit 0 when a worker would start with them, 1 otherwise. Nothing is started and nothing is reached.
A network.allow entry that names a worker endpoint (NATS, store, model) by host and port is
warned of: the egress proxy never lets a sandbox reach it.`,
		Args: cli.Args(1, 1, "check-config: give one config FILE"),
		RunE: func(_ *cobra.Command, a []string) error {
			cfg, src, err := config.LoadSource(a[0])
			if err == nil {
				err = src.Place(agent.CheckProfiles(cfg.Profiles))
			}
			var env startEnv
			if err == nil {
				env, err = readStartEnv(&cfg, conn, false, getenv)
			}
			if err != nil {
				return checkFailed(stdout, a[0], err)
			}
			if _, err = fmt.Fprintf(stdout, "%s: ok, %s\n", a[0], count(len(cfg.Profiles), "profile")); err != nil {
				return err
			}
			if err := printTenants(stdout, cfg); err != nil {
				return err
			}
			for _, w := range allowedEndpoints(cfg, env.modelURL) {
				if _, err := fmt.Fprintln(stdout, cli.Escape(w)); err != nil {
					return err
				}
			}
			return nil
		},
	}
	bindConnFlags(c.Flags(), &conn)
	return c
}

// printTenants prints what each tenant may run and spend, and where its objects go, one line
// each: what an operator checks before handing out identities.
func printTenants(w io.Writer, cfg config.Config) error {
	all := cfg.TenantsOrDefault()
	names := slices.Sorted(maps.Keys(all))
	for _, name := range names {
		t := all[name]
		label := name
		if len(cfg.Tenants) == 0 {
			label += " (no tenants: section; every profile)"
		}
		tokens := "unlimited"
		if t.DailyTokens > 0 {
			tokens = strconv.FormatInt(t.DailyTokens, 10)
		}
		where := "store prefix tenants/" + name + "/"
		if t.Bucket != "" {
			where = "bucket " + t.Bucket
		}
		if _, err := fmt.Fprintf(w, "  tenant %s: profiles %s; max_concurrent %d; daily_tokens %s; %s; %s\n",
			label, strings.Join(t.Profiles, ", "), t.MaxConcurrent, tokens, queueBound(cfg, name, t), where); err != nil {
			return err
		}
	}
	return nil
}

// checkFailed prints each problem of err on its own line, escaped (a message can quote the
// file), and fails with their count.
func checkFailed(stdout io.Writer, file string, err error) error {
	problems := leaves(err)
	for _, p := range problems {
		if _, werr := fmt.Fprintln(stdout, cli.Escape(p.Error())); werr != nil {
			return werr
		}
	}
	return &cli.ExitError{Code: 1, Msg: fmt.Sprintf("%s: %s", file, count(len(problems), "problem"))}
}

func count(n int, noun string) string {
	if n == 1 {
		return "1 " + noun
	}
	return fmt.Sprintf("%d %ss", n, noun)
}

// leaves are the errors a joined error holds, each on its own.
func leaves(err error) []error {
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		var out []error
		for _, e := range j.Unwrap() {
			out = append(out, leaves(e)...)
		}
		return out
	}
	return []error{err}
}
