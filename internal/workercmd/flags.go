package workercmd

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/spf13/pflag"
)

// options are the worker's command-line settings. Every flag of the worker command is defined
// in bindFlags, and nowhere else.
type options struct {
	embedded    bool
	configPath  string
	dataDir     string
	natsListen  string
	metricsAddr string
	logLevel    string
	signingKey  string
}

// bindFlags adds the worker's flags to fs, in the order `worker --help` lists them.
func bindFlags(fs *pflag.FlagSet, o *options) {
	fs.SortFlags = false
	fs.BoolVar(&o.embedded, "embedded", false, "run NATS in-process and use the file store under the data dir")
	fs.StringVar(&o.configPath, "config", "", "worker config `FILE` (YAML) with the execution profiles; default with --embedded: the example profiles")
	fs.StringVar(&o.dataDir, "data-dir", "", "data `DIR` for --embedded (default $BOXCAR_HOME, else ~/.boxcar)")
	fs.StringVar(&o.natsListen, "nats-listen", "127.0.0.1:4222", "`ADDR` of the embedded NATS server (port 0: any free port)")
	fs.StringVar(&o.metricsAddr, "metrics-addr", "", "`ADDR` for /metrics, /healthz and /readyz (default from the config, 127.0.0.1:9464; \"off\" disables)")
	fs.StringVar(&o.logLevel, "log-level", "info", "log `LEVEL`: debug, info, warn, error")
	fs.StringVar(&o.signingKey, "signing-key", "", "ed25519 private key `FILE` (PEM) that signs manifests (default: the config's signing_key; with --embedded, <data dir>/keys/signing.key, created on first start)")
}

// withDefaults fills what the flags leave to the environment: the data dir.
func (o options) withDefaults(getenv func(string) string) (options, error) {
	if o.dataDir == "" {
		o.dataDir = getenv("BOXCAR_HOME")
	}
	if o.dataDir == "" {
		home, err := os.UserHomeDir()
		if err != nil {
			return o, fmt.Errorf("no --data-dir, no BOXCAR_HOME and no home directory: %w", err)
		}
		o.dataDir = filepath.Join(home, ".boxcar")
	}
	return o, nil
}

// longDashes rewrites the single-dash long flags of the standard library's flag package, which
// the worker used before cobra (`-config x`, `-embedded`), to pflag's double dash, so scripts
// written for it keep working. Only names fs knows are rewritten, and nothing after "--".
func longDashes(args []string, fs *pflag.FlagSet) []string {
	out := make([]string, 0, len(args))
	for i, a := range args {
		if a == "--" {
			return append(out, args[i:]...)
		}
		name, _, _ := strings.Cut(strings.TrimPrefix(a, "-"), "=")
		if len(a) > 2 && a[0] == '-' && a[1] != '-' && len(name) > 1 && fs.Lookup(name) != nil {
			a = "-" + a
		}
		out = append(out, a)
	}
	return out
}
