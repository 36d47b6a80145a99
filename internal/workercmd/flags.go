package workercmd

import (
	"fmt"
	"io"
	"path/filepath"
	"strings"

	"github.com/spf13/pflag"
)

// Options are the worker's settings: one field per flag (bindFlags defines the flags, and
// nothing else does), the environment and where it writes.
type Options struct {
	Embedded    bool      // --embedded
	ConfigPath  string    // --config
	DataDir     string    // --data-dir; default $BOXCAR_HOME, else ~/.boxcar
	NATSListen  string    // --nats-listen; default 127.0.0.1:4222, port 0 any free port
	MetricsAddr string    // --metrics-addr; default the config's metrics_addr
	LogLevel    string    // --log-level; default info
	SigningKey  string    // --signing-key
	ReadyFile   string    // --ready-file
	conn        connFlags // --nats-creds … --model-ca (conn.go)

	// Getenv reads the environment (OPENAI_API_KEY, NATS_URL, BOXCAR_STORE, BOXCAR_HOME, HOME,
	// the AWS SDK's AWS_* settings, …); nil reads nothing. The worker reads no other
	// environment, so workers with different ones can share a process.
	Getenv func(string) string
	// Stdout gets the one "worker ready" line written for people, Stderr the JSON log; nil
	// discards.
	Stdout, Stderr io.Writer
}

// bindFlags adds the worker's flags to fs, in the order `worker --help` lists them.
func bindFlags(fs *pflag.FlagSet, o *Options) {
	fs.SortFlags = false
	fs.BoolVar(&o.Embedded, "embedded", false, "run NATS in-process and use the file store under the data dir")
	fs.StringVar(&o.ConfigPath, "config", "", "worker config `FILE` (YAML) with the execution profiles; default with --embedded: the example profiles")
	fs.StringVar(&o.DataDir, "data-dir", "", "data `DIR` for --embedded (default $BOXCAR_HOME, else ~/.boxcar)")
	fs.StringVar(&o.NATSListen, "nats-listen", "127.0.0.1:4222", "`ADDR` of the embedded NATS server (port 0: any free port)")
	fs.StringVar(&o.MetricsAddr, "metrics-addr", "", "`ADDR` for /metrics, /healthz and /readyz (default from the config, 127.0.0.1:9464; \"off\" disables)")
	fs.StringVar(&o.LogLevel, "log-level", "info", "log `LEVEL`: debug, info, warn, error")
	fs.StringVar(&o.SigningKey, "signing-key", "", "ed25519 private key `FILE` (PEM) that signs manifests (default: the config's signing_key; with --embedded, <data dir>/keys/signing.key, created on first start)")
	bindConnFlags(fs, &o.conn)
	fs.StringVar(&o.ReadyFile, "ready-file", "", "`FILE` written atomically once the worker takes jobs: JSON with its addresses (nats, metrics, store), for a parent process to wait on; removed when it stops")
}

// ParseOptions reads the worker's flags from args, for callers of Start that hold a command
// line (tests, a supervisor); Getenv, Stdout and Stderr are left to the caller.
func ParseOptions(args []string) (Options, error) {
	var o Options
	fs := pflag.NewFlagSet("worker", pflag.ContinueOnError)
	fs.SetOutput(io.Discard)
	bindFlags(fs, &o)
	if err := fs.Parse(longDashes(args, fs)); err != nil {
		return o, fmt.Errorf("worker: %w", err)
	}
	if fs.NArg() > 0 {
		return o, fmt.Errorf("worker: unexpected argument %q", fs.Arg(0))
	}
	return o, nil
}

// withDefaults fills what the flags leave unset: the data dir from the environment, the log
// level, the streams.
func (o Options) withDefaults() (Options, error) {
	if o.Getenv == nil {
		o.Getenv = func(string) string { return "" }
	}
	if o.Stdout == nil {
		o.Stdout = io.Discard
	}
	if o.Stderr == nil {
		o.Stderr = io.Discard
	}
	if o.NATSListen == "" {
		o.NATSListen = "127.0.0.1:4222"
	}
	if o.LogLevel == "" {
		o.LogLevel = "info"
	}
	if o.DataDir == "" {
		o.DataDir = o.Getenv("BOXCAR_HOME")
	}
	// $HOME through Getenv, not the process's: a test's worker gets the home it is given.
	if home := o.Getenv("HOME"); o.DataDir == "" && home != "" {
		o.DataDir = filepath.Join(home, ".boxcar")
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
