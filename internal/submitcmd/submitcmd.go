// Package submitcmd is the submit command: it hands jobs to Boxcar and follows them. It talks to
// NATS and the store, never to sandboxes. The command tree is cobra's (root.go); cmd/submit adds
// only signals and the exit code.
package submitcmd

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/spf13/cobra"

	"github.com/boxcar-run/boxcar/internal/cli"
	"github.com/boxcar-run/boxcar/internal/config"
	"github.com/boxcar-run/boxcar/internal/connflags"
	"github.com/boxcar-run/boxcar/internal/job"
	"github.com/boxcar-run/boxcar/internal/queue"
	"github.com/boxcar-run/boxcar/internal/store"
)

// ExitError carries a process exit code out of Run, with the message to print (may be empty).
type ExitError struct {
	Code int
	Msg  string
	Kind string // the error code for --output json when the exit code alone does not say it
	// Shown: the error is already on stderr (as JSON, --output json); main prints nothing.
	Shown bool
}

func (e *ExitError) Error() string { return fmt.Sprintf("exit %d: %s", e.Code, e.Msg) }

// Exit codes beyond 0 (succeeded) and 1 (error or bad usage); the docs' table lists them.
const (
	exitFailed       = 2
	exitCapped       = 3
	exitRejected     = 4
	exitCancelled    = 5
	exitDead         = 6
	exitGaveUp       = 7
	exitVerifyFailed = 8
	// exitNotConfirmed: approve or deny asked on a terminal and was not answered y; nothing
	// was signed. (9 is exitUnknown, publish.go.)
	exitNotConfirmed = 10
	// exitInterrupted is the shell's code for a command ended by SIGINT (128+2).
	exitInterrupted = 130
)

// exitCodes maps terminal states to the documented exit codes.
var exitCodes = map[job.State]int{
	job.StateSucceeded: 0,
	job.StateFailed:    exitFailed,
	job.StateCapped:    exitCapped,
	job.StateRejected:  exitRejected,
	job.StateCancelled: exitCancelled,
	job.StateDead:      exitDead,
}

// Run is the whole submit command; main only adds signals and the exit code. Tests call it.
func Run(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	if args == nil {
		args = []string{} // cobra reads os.Args when given nil
	}
	if len(args) > 0 && args[0] == "-version" {
		args = append([]string{"version"}, args[1:]...)
	}
	return run(ctx, &env{getenv: getenv, stdout: stdout, stderr: stderr, publish: defaultPublishPolicy, patience: defaultPatience}, args)
}

// run executes args against e; tests use it to shorten e's retry policy.
func run(ctx context.Context, e *env, args []string) error {
	e.raw, e.rawErr = e.stdout, e.stderr
	if e.patience == 0 {
		e.patience = defaultPatience
	}
	e.stdout, e.stderr = &safeWriter{w: e.stdout}, &safeWriter{w: e.stderr}
	root := newRoot(e)
	root.SetArgs(args)
	err := root.ExecuteContext(ctx)
	var exit *ExitError
	if err != nil && errors.Is(ctx.Err(), context.Canceled) && (!errors.As(err, &exit) || exit.Code != exitInterrupted) {
		err = &ExitError{Code: exitInterrupted, Msg: fmt.Sprintf("interrupted: %v", err)}
	}
	if err != nil && (e.json() || wantsJSON(args)) {
		return writeJSONError(e.stderr, err)
	}
	return err
}

// ExitCode is how cmd/submit ends for err: the exit code and the message to print (empty for
// none), with every control and format character escaped, since a message can quote a job.
func ExitCode(err error) (code int, msg string) {
	var exit *ExitError
	switch {
	case err == nil:
		return 0, ""
	case errors.As(err, &exit) && exit.Shown:
		return exit.Code, ""
	case errors.As(err, &exit):
		return exit.Code, clean(exit.Msg)
	default:
		return 1, clean(err.Error())
	}
}

// env is what every command shares: where NATS and the store are, and the output streams.
type env struct {
	getenv     func(string) string
	stdin      io.Reader // for --jobs - and approve's y/N; os.Stdin when nil
	stdout     io.Writer // a safeWriter once run starts
	stderr     io.Writer // a safeWriter once run starts
	raw        io.Writer // stdout as given, for output that must stay byte for byte
	natsURL    string
	configPath string // --config: the workers' config, whose nats names submit uses
	tenantFlag string
	storeURL   string
	s3Endpoint string
	s3CA       string
	natsAuth   connflags.NATS // credentials and TLS for NATS (connflags)
	output     string
	publish    publishPolicy
	patience   time.Duration // how long NATS or the store may take to answer; see retry.go
	rawErr     io.Writer     // stderr as given, to tell a terminal
	link       *natsLink     // says when the NATS connection is lost; nil before connect
	// wrapStore, when set, wraps the store each command opens: a test's writer of the store
	// acting between two of its reads.
	wrapStore func(store.Store) store.Store
}

func (e *env) json() bool { return e.output == "json" }

// input is what the command reads: e.stdin, else the process's.
func (e *env) input() io.Reader {
	if e.stdin != nil {
		return e.stdin
	}
	return os.Stdin
}

// tenant is the tenant submit acts for: --tenant, else $BOXCAR_TENANT, else job.DefaultTenant.
// The server's permissions decide whether the credentials may act for it.
func (e *env) tenant() string {
	switch {
	case e.tenantFlag != "":
		return e.tenantFlag
	case e.getenv("BOXCAR_TENANT") != "":
		return e.getenv("BOXCAR_TENANT")
	}
	return job.DefaultTenant
}

// checkTenant refuses a tenant that is no tenant name (job.ValidTenant) as bad usage, naming
// where it came from, before NATS or the store is asked: NATS refused it at every lookup,
// which submit waited out as an outage (30 s, run its whole --timeout), and the store read
// under tenants/<whatever was given>/.
func (e *env) checkTenant() error {
	t := e.tenant()
	if job.ValidTenant(t) {
		return nil
	}
	from := "--tenant"
	if e.tenantFlag == "" {
		from = "BOXCAR_TENANT"
	}
	return cli.Usagef("%s %q is not a tenant name: %s", from, t, job.TenantRule)
}

// jobIDArgs takes min to max arguments (msg says what to give), the first of them a job id: one
// that cannot be is bad usage, said before NATS, the store or a key is read. status, watch, logs,
// cancel and approvals asked NATS about it (and, NATS away, said only that it was unreachable).
func jobIDArgs(min, max int, msg string) cobra.PositionalArgs {
	count := cli.Args(min, max, msg)
	return func(c *cobra.Command, a []string) error {
		if err := count(c, a); err != nil {
			return err
		}
		if len(a) > 0 && !job.ValidID(a[0]) {
			return cli.Usagef("%s: %q is not a job id: 8 to 64 lowercase letters, digits and '-' (`submit list` lists the jobs)", c.Name(), a[0])
		}
		return nil
	}
}

// atLeast refuses a duration flag below least: a negative --since meant no filter at all, and a
// timeout of zero or less gave up at once, after the job was submitted.
func atLeast(flag string, d, least time.Duration) error {
	if d >= least {
		return nil
	}
	if least <= 0 {
		return cli.Usagef("%s %s: give a duration of 0 or more, how far back (e.g. 2h)", flag, d)
	}
	return cli.Usagef("%s %s: give a positive duration (e.g. 10m)", flag, d)
}

// natsConfig is the NATS settings of the workers' config (--config, else $BOXCAR_CONFIG), else
// the defaults, at the URL of --nats, else $NATS_URL, else the config's: a fleet that renames
// its stream, subject, consumer or buckets is reached through the file its workers read. An
// error names which of them is wrong, never a URL's value (it may hold a password).
func (e *env) natsConfig() (config.NATS, error) {
	cfg := config.Config{Profiles: nil}.WithDefaults().NATS
	path, from := e.configPath, "--config"
	if path == "" {
		path, from = e.getenv("BOXCAR_CONFIG"), "BOXCAR_CONFIG"
	}
	if path != "" {
		c, err := config.Load(path)
		if err != nil {
			return config.NATS{}, cli.Usagef("%s: the workers' config: %v", from, err)
		}
		cfg = c.NATS
	}
	u, err := e.checkedURL(e.natsURL, "--nats", "NATS_URL", "nats.url")
	if u != "" {
		cfg.URL = u
	}
	return cfg, err
}

// checkedURL is the URL of flag (named name), else of the variable env, checked by the rule of
// the workers' config key it stands for as a flag or a variable gives it (config.CheckURL: a
// flag, in the process list, carries no secret); an error names which of them is wrong, never
// its value (it may hold a password).
func (e *env) checkedURL(flag, name, env, key string) (string, error) {
	u, from, src := flag, name, config.FromFlag
	if u == "" {
		u, from, src = e.getenv(env), env, config.FromEnv
	}
	if u == "" {
		return "", nil
	}
	if err := config.CheckURL(key, src, u); err != nil {
		return "", cli.Usagef("%s: %v", from, err)
	}
	return u, nil
}

// connect reaches NATS and binds to the queue a worker set up, failing fast with a message that
// says what to start.
func (e *env) connect(ctx context.Context) (*nats.Conn, *queue.Client, error) {
	if err := e.checkTenant(); err != nil {
		return nil, nil, err
	}
	cfg, err := e.natsConfig()
	if err != nil {
		return nil, nil, err
	}
	opts, err := e.connOptions(cfg.URL)
	if err != nil {
		return nil, nil, err
	}
	cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	nc, err := queue.Connect(cctx, opts)
	if err != nil {
		return nil, nil, refusedLogin(err, cfg.URL)
	}
	e.watchLink(nc, cfg.URL)
	q, err := e.bind(ctx, nc, cfg)
	if err != nil {
		nc.Close()
		return nil, nil, err
	}
	return nc, q, nil
}

// refusedLogin is err, when the server answered and refused the credentials (nats.go's auth
// errors), saying so and where credentials are given: queue.Connect's hint is for a server
// nobody runs ("start one with `worker --embedded`"), which a wrong token was told too.
func refusedLogin(err error, url string) error {
	for _, refused := range []error{nats.ErrAuthorization, nats.ErrAuthExpired, nats.ErrAuthRevoked, nats.ErrAccountAuthExpired} {
		if errors.Is(err, refused) {
			return fmt.Errorf("NATS at %s refused the credentials (%w): give the ones issued for you with --nats-creds, --nats-nkey, --nats-user and --nats-password-file, or --nats-token-file (or their variables); on the embedded worker's machine, none: its token in $BOXCAR_HOME/nats.token is read (docs/security.md)",
				queue.RedactURL(url), refused)
		}
	}
	return err
}

// openStore opens the store of the tenant submit acts for: every key under
// store.TenantPrefix(tenant) of the store's URL, where the workers read and write that
// tenant's objects.
func (e *env) openStore(ctx context.Context) (store.Store, error) {
	if err := e.checkTenant(); err != nil {
		return nil, err
	}
	st, err := e.openSharedStore(ctx)
	if err != nil {
		return nil, err
	}
	var tenant store.Store = tenantStore{Store: store.ForTenant(st, e.tenant()), shared: st}
	if e.wrapStore != nil {
		tenant = e.wrapStore(tenant)
	}
	return tenant, nil
}

// tenantStore is a tenant's store that closes the store it is in when closed.
type tenantStore struct {
	store.Store
	shared store.Store
}

func (s tenantStore) Close() error { return s.shared.Close() }

// Partials, DiscardPartial and PruneFolders are the tenant store's (store.Partials).
func (s tenantStore) Partials(ctx context.Context, prefix string) ([]store.Partial, error) {
	return store.Partials(ctx, s.Store, prefix)
}

func (s tenantStore) DiscardPartial(ctx context.Context, p store.Partial) error {
	return store.DiscardPartial(ctx, s.Store, p)
}

func (s tenantStore) PruneFolders(ctx context.Context, prefix string) error {
	return store.PruneFolders(ctx, s.Store, prefix)
}

func (e *env) openSharedStore(ctx context.Context) (store.Store, error) {
	u, err := e.checkedURL(e.storeURL, "--store", "BOXCAR_STORE", "store.url")
	if err != nil {
		return nil, err
	}
	if u == "" {
		home, err := e.home()
		if err != nil {
			return nil, fmt.Errorf("no --store, BOXCAR_STORE or BOXCAR_HOME, and no home directory: %w", err)
		}
		u = "file://" + filepath.Join(home, "store")
	}
	endpoint, err := e.checkedURL(e.s3Endpoint, "--s3-endpoint", "BOXCAR_S3_ENDPOINT", "store.endpoint")
	if err != nil {
		return nil, err
	}
	// The one create-only put submit sends is an input's, under its digest: one that overwrites
	// writes the same bytes. So a server that ignores If-None-Match, which workers run on with
	// store.allow_unsafe_overwrite, takes submit's inputs; the store's probe refused them, and
	// run waited out its --timeout naming a worker's setting.
	opts := store.Options{Endpoint: endpoint, PathStyle: endpoint != "", Getenv: e.getenv, AllowUnsafeOverwrite: true, Submitter: true}
	ca := e.s3CA
	if ca == "" {
		ca = e.getenv("BOXCAR_S3_CA")
	}
	if ca != "" {
		t, err := connflags.Transport(ca)
		if err != nil {
			return nil, fmt.Errorf("--s3-ca: %w", err)
		}
		opts.HTTPClient = &http.Client{Transport: t}
	}
	return store.Open(ctx, u, opts)
}

// connOptions are the NATS connection options of the flags and environment; with none, the
// embedded worker's token from BOXCAR_HOME when the server is on this machine.
func (e *env) connOptions(url string) (queue.ConnOptions, error) {
	opts, err := e.natsAuth.Options(url, "boxcar-submit", e.getenv)
	if err != nil {
		return opts, err
	}
	home, err := e.home()
	if err != nil {
		return opts, nil // no home, no embedded worker's token
	}
	return connflags.WithEmbeddedToken(opts, home)
}

// home is $BOXCAR_HOME, else ~/.boxcar.
func (e *env) home() (string, error) {
	if h := e.getenv("BOXCAR_HOME"); h != "" {
		return h, nil
	}
	h := e.getenv("HOME") // through getenv, as every setting: tests give each run its own
	if h == "" {
		return "", errors.New("HOME is not set")
	}
	return filepath.Join(h, ".boxcar"), nil
}

// closeStore releases the store; a read-only command has nothing to lose if it fails.
func closeStore(st store.Store) { _ = st.Close() }

// printJSON writes v as one line of JSON.
func (e *env) printJSON(v any) error {
	data, err := json.Marshal(v)
	if err != nil {
		return err
	}
	_, err = fmt.Fprintln(e.stdout, string(data))
	return err
}

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
