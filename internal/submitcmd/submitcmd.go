// Package submitcmd is the submit command: it hands jobs to Boxcar and follows them. It talks to
// NATS and the store, never to sandboxes. cmd/submit adds only signals and the exit code.
package submitcmd

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/boxcar-run/boxcar/internal/config"
	"github.com/boxcar-run/boxcar/internal/job"
	"github.com/boxcar-run/boxcar/internal/provenance"
	"github.com/boxcar-run/boxcar/internal/queue"
	"github.com/boxcar-run/boxcar/internal/store"
)

const usage = `usage: submit <command> [flags]

Commands:
  run     --profile NAME --task TEXT [--input FILE]... [--wait] [--output text|json]
  status  JOB_ID [--output text|json]
  watch   JOB_ID [--output text|json]
  get     JOB_ID --out DIR                downloads the run, checking every file against the manifest
  manifest JOB_ID [--output text|json]   what produced the run: inputs, profile, model, tools
  approvals [JOB_ID] [--output text|json] shell commands waiting for a person (policy "ask")
  approve JOB_ID CALL_ID                 lets the command run; each request is answered once
  deny    JOB_ID CALL_ID [--reason TEXT] refuses it; the model is told the reason. No answer
                                         within the profile's approval_timeout means denied
  verify  JOB_ID [--public-key FILE] [--require-signature] [--output text|json]
                                         checks the run against its manifest and the manifest's
                                         signature (default key: $BOXCAR_HOME/keys/signing.pub)
  keygen  --out DIR                      writes a new signing key pair (signing.key, signing.pub)
  version                                the build: version, VCS revision, Go version

Common flags (every command but keygen): --nats URL (NATS_URL, default nats://127.0.0.1:4222),
--store URL (BOXCAR_STORE, default file://$BOXCAR_HOME/store, BOXCAR_HOME default ~/.boxcar),
--s3-endpoint URL (BOXCAR_S3_ENDPOINT) for S3-compatible services.

Exit codes of run --wait and watch: 0 succeeded, 1 error or bad usage, 2 failed, 3 capped, 4 rejected,
5 cancelled, 6 dead (retries exhausted), 7 gave up waiting.
Exit codes of verify and get: 0 verified, 1 error (store unreachable, bad usage), 8 verification
failed (a file changed or missing, a bad signature, no valid manifest).
`

// ExitError carries a process exit code out of Run, with the message to print (may be empty).
type ExitError struct {
	Code int
	Msg  string
}

func (e *ExitError) Error() string { return fmt.Sprintf("exit %d: %s", e.Code, e.Msg) }

// exitCodes maps terminal states to the documented exit codes.
var exitCodes = map[job.State]int{
	job.StateSucceeded: 0,
	job.StateFailed:    2,
	job.StateCapped:    3,
	job.StateRejected:  4,
	job.StateCancelled: 5,
	job.StateDead:      6,
}

const exitGaveUp = 7

// env is what every command shares: where NATS and the store are, and the output streams.
type env struct {
	getenv     func(string) string
	stdout     io.Writer
	stderr     io.Writer
	natsURL    string
	storeURL   string
	s3Endpoint string
	output     string
}

func Run(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	if len(args) == 0 || args[0] == "-h" || args[0] == "--help" || args[0] == "help" {
		fmt.Fprint(stdout, usage)
		if len(args) == 0 {
			return &ExitError{Code: 1}
		}
		return nil
	}
	e := &env{getenv: getenv, stdout: stdout, stderr: stderr}
	cmd, rest := args[0], args[1:]
	switch cmd {
	case "run":
		return e.run(ctx, rest)
	case "status":
		return e.status(ctx, rest)
	case "watch":
		return e.watch(ctx, rest)
	case "get":
		return e.get(ctx, rest)
	case "manifest":
		return e.manifest(ctx, rest)
	case "cancel":
		return e.cancel(ctx, rest)
	case "approvals":
		return e.approvals(ctx, rest)
	case "approve":
		return e.decide(ctx, "approve", queue.DecisionApproved, rest)
	case "deny":
		return e.decide(ctx, "deny", queue.DecisionDenied, rest)
	case "verify":
		return e.verify(ctx, rest)
	case "keygen":
		return e.keygen(rest)
	case "version", "--version", "-version":
		_, err := fmt.Fprintln(stdout, "submit", provenance.WorkerInfo("").String())
		return err
	default:
		return fmt.Errorf("unknown command %q\n%s", cmd, usage)
	}
}

// flags returns a flag set with the common flags bound to e.
func (e *env) flags(name string) *flag.FlagSet {
	fs := flag.NewFlagSet("submit "+name, flag.ContinueOnError)
	fs.SetOutput(e.stderr)
	fs.StringVar(&e.natsURL, "nats", "", "NATS URL (default $NATS_URL, else nats://127.0.0.1:4222)")
	fs.StringVar(&e.storeURL, "store", "", "store URL: file:///path or s3://bucket[/prefix] (default $BOXCAR_STORE, else file://$BOXCAR_HOME/store)")
	fs.StringVar(&e.s3Endpoint, "s3-endpoint", "", "endpoint of an S3-compatible service (default $BOXCAR_S3_ENDPOINT)")
	fs.StringVar(&e.output, "output", "text", "output format: text or json")
	return fs
}

// parse parses flags that may come before or after positional arguments.
func (e *env) parse(fs *flag.FlagSet, args []string) ([]string, error) {
	var positional []string
	for {
		if err := fs.Parse(args); err != nil {
			return nil, err
		}
		args = fs.Args()
		if len(args) == 0 {
			break
		}
		positional = append(positional, args[0])
		args = args[1:]
	}
	if e.output != "text" && e.output != "json" {
		return nil, fmt.Errorf("--output %q: use text or json", e.output)
	}
	return positional, nil
}

func (e *env) natsConfig() config.NATS {
	cfg := config.Config{Profiles: nil}.WithDefaults().NATS
	switch {
	case e.natsURL != "":
		cfg.URL = e.natsURL
	case e.getenv("NATS_URL") != "":
		cfg.URL = e.getenv("NATS_URL")
	}
	return cfg
}

// connect reaches NATS and binds to the queue a worker set up, failing fast with a message that
// says what to start.
func (e *env) connect(ctx context.Context) (*nats.Conn, *queue.Queue, error) {
	cfg := e.natsConfig()
	cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	nc, err := queue.Connect(cctx, cfg.URL, "boxcar-submit")
	if err != nil {
		return nil, nil, err
	}
	q, err := queue.Bind(cctx, nc, cfg)
	if err != nil {
		nc.Close()
		return nil, nil, err
	}
	return nc, q, nil
}

func (e *env) openStore(ctx context.Context) (store.Store, error) {
	u := e.storeURL
	if u == "" {
		u = e.getenv("BOXCAR_STORE")
	}
	if u == "" {
		home := e.getenv("BOXCAR_HOME")
		if home == "" {
			h, err := os.UserHomeDir()
			if err != nil {
				return nil, fmt.Errorf("no --store, BOXCAR_STORE or BOXCAR_HOME, and no home directory: %w", err)
			}
			home = filepath.Join(h, ".boxcar")
		}
		u = "file://" + filepath.Join(home, "store")
	}
	endpoint := e.s3Endpoint
	if endpoint == "" {
		endpoint = e.getenv("BOXCAR_S3_ENDPOINT")
	}
	return store.Open(ctx, u, store.Options{Endpoint: endpoint, PathStyle: endpoint != ""})
}

// printJSON writes v as one line of JSON.
func (e *env) printJSON(v any) error {
	data, err := json.Marshal(v)
	if err != nil {
		return err
	}
	_, err = fmt.Fprintln(e.stdout, string(data))
	return err
}

// stringList is a repeatable flag.
type stringList []string

func (s *stringList) String() string     { return strings.Join(*s, ",") }
func (s *stringList) Set(v string) error { *s = append(*s, v); return nil }

// finalExit turns a terminal status into the documented exit code.
func finalExit(st job.Status) error {
	code, ok := exitCodes[st.State]
	if !ok {
		return &ExitError{Code: exitGaveUp, Msg: fmt.Sprintf("job %s is %s", st.ID, st.State)}
	}
	if code == 0 {
		return nil
	}
	msg := fmt.Sprintf("job %s %s", st.ID, st.State)
	if st.Cap != "" {
		msg += " (cap: " + st.Cap + ")"
	}
	if st.Error != "" {
		msg += ": " + st.Error
	}
	return &ExitError{Code: code, Msg: msg}
}
