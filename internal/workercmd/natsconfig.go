package workercmd

import (
	"fmt"
	"io"
	"maps"
	"slices"
	"sort"

	"github.com/spf13/cobra"

	"github.com/boxcar-run/boxcar/internal/cli"
	"github.com/boxcar-run/boxcar/internal/config"
	"github.com/boxcar-run/boxcar/internal/natsconfig"
)

// natsConfigCmd is `worker nats-config`: the nats-server configuration and one .creds file per
// identity of the config's tenants, with the permissions of docs/security.md.
func natsConfigCmd(stdout io.Writer) *cobra.Command {
	var file string
	var o natsconfig.Options
	var tls natsconfig.TLS
	c := &cobra.Command{
		Use:   "nats-config --config FILE --out DIR",
		Short: "write a nats-server configuration and a .creds file per identity (submitter and approver per tenant, worker, operator)",
		Long: `Reads the tenants of a worker config and writes DIR/nats-server.conf (JWT mode: an operator, a
system account and the account BOXCAR in a memory resolver, JetStream on), DIR/auth.conf (the
same identities alone, to include from a server configuration made elsewhere, such as the NATS
Helm chart's) and DIR/creds/NAME.creds
for each identity: TENANT-submitter and TENANT-approver for each tenant, worker and operator.
Each identity may publish and subscribe to exactly what docs/security.md lists for its role.
Give the server the configuration, each program its .creds file (--nats-creds, NATS_CREDS).
DIR must not hold an earlier generation: a new one makes a new operator, which ends every
earlier login once the server loads it. Files are written with mode 0600.`,
		Args: cli.Args(0, 0, "nats-config: takes no arguments; give --config FILE and --out DIR"),
		RunE: func(*cobra.Command, []string) error {
			cfg := config.Config{}.WithDefaults()
			if file != "" {
				var err error
				if cfg, err = config.Load(file); err != nil {
					return err
				}
			}
			o.Names, o.Tenants = natsconfig.NamesOf(cfg.NATS), tenantNames(cfg)
			if tls != (natsconfig.TLS{}) {
				o.TLS = &tls
			}
			res, err := natsconfig.Generate(o)
			if err != nil {
				return err
			}
			return printGenerated(stdout, res)
		},
	}
	f := c.Flags()
	f.StringVar(&file, "config", "", "worker config `FILE` whose tenants and NATS names to use (default: the tenant default and the default names)")
	f.StringVar(&o.Dir, "out", "", "`DIR` to write nats-server.conf and creds/ into (required; must not hold an earlier generation)")
	f.StringVar(&o.Listen, "listen", "", "the server's client `HOST:PORT` (default: the server's, 0.0.0.0:4222)")
	f.StringVar(&o.StoreDir, "jetstream-dir", "", "JetStream's store `DIR` on the server (default: the server's)")
	f.StringVar(&tls.Cert, "tls-cert", "", "the server's certificate `FILE` (PEM), as the server sees it: the server then speaks TLS only")
	f.StringVar(&tls.Key, "tls-key", "", "the server's key `FILE` (PEM)")
	f.StringVar(&tls.ClientCA, "tls-ca", "", "CA `FILE` (PEM) that signs client certificates: the server then requires one (mTLS)")
	_ = c.MarkFlagFilename("config", "yaml", "yml")
	_ = c.MarkFlagDirname("out")
	return c
}

// tenantNames are the config's tenants (without a tenants: section, default), sorted.
func tenantNames(cfg config.Config) []string {
	return slices.Sorted(maps.Keys(cfg.TenantsOrDefault()))
}

func printGenerated(w io.Writer, res natsconfig.Result) error {
	names := make([]string, 0, len(res.Creds))
	for n := range res.Creds {
		names = append(names, n)
	}
	sort.Strings(names)
	if _, err := fmt.Fprintf(w, "server configuration: %s\nidentities only, to include: %s\naccount BOXCAR: %s\n", res.ServerConfig, res.AuthConfig, res.Account); err != nil {
		return err
	}
	for _, n := range names {
		if _, err := fmt.Fprintf(w, "%-24s %s\n", n+":", res.Creds[n]); err != nil {
			return err
		}
	}
	return nil
}
