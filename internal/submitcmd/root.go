package submitcmd

import (
	"fmt"
	"io"
	"strings"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/boxcar-run/boxcar/internal/cli"
	"github.com/boxcar-run/boxcar/internal/provenance"
)

// commonFlag marks the flags every command that reaches NATS or the store shares; the synopsis
// leaves them to the "Common flags" paragraph, all but --output, and the docs' tables list them
// once.
const commonFlag = cli.CommonFlag

// requiredFlag marks a flag the synopsis shows without brackets. The command checks it itself,
// with its own message (cobra's required-flag check would replace it).
const requiredFlag = "boxcar/required"

// altSynopsis on a command is a second synopsis line (its flags after the name); on a flag it
// keeps the flag out of the first line.
const altSynopsis = "boxcar/alt-synopsis"

func markRequired(c *cobra.Command, names ...string) {
	for _, n := range names {
		_ = c.Flags().SetAnnotation(n, requiredFlag, []string{"true"})
	}
}

// NewCommand builds submit's command tree, as Run does, for what is generated from it (the
// flag tables of docs/cli.md).
func NewCommand(getenv func(string) string, stdout, stderr io.Writer) *cobra.Command {
	return newRoot(&env{getenv: getenv, stdout: stdout, stderr: stderr, raw: stdout, publish: defaultPublishPolicy})
}

// newRoot builds the command tree bound to e. Every Run builds a fresh one, so flag values never
// leak from one call into the next.
func newRoot(e *env) *cobra.Command {
	root := cli.NewRoot("submit", "hand jobs to Boxcar and follow them", e.stdout, e.stderr)
	// No arguments: the usage, and exit 1, as a script that forgot the command expects.
	root.RunE = func(c *cobra.Command, _ []string) error {
		c.SetOut(e.stdout)
		if err := c.Help(); err != nil {
			return err
		}
		return &ExitError{Code: 1}
	}
	root.Args = func(_ *cobra.Command, a []string) error { return unknownCommand(root, a) }
	root.AddCommand(
		e.runCmd(), e.statusCmd(), e.watchCmd(), e.listCmd(), e.logsCmd(), e.profilesCmd(),
		e.getCmd(), e.cancelCmd(), e.manifestCmd(),
		e.verifyCmd(), e.keygenCmd(), e.versionCmd(),
		e.approvalsCmd(), e.approveCmd(), e.denyCmd(), e.gcCmd(),
		cli.Completion(root, func() io.Writer { return e.raw }),
	)
	e.completeArgs(root)
	cli.SetRootHelp(root, rootHelp)
	return root
}

// rootHelp is `submit --help`: the synopsis (the same text the docs carry), what each command
// does, the flags they share and the exit codes.
func rootHelp(root *cobra.Command) string {
	var b strings.Builder
	b.WriteString("submit hands jobs to Boxcar and follows them.\n\nUsage:\n")
	for _, line := range strings.Split(strings.TrimSuffix(Synopsis(root), "\n"), "\n") {
		b.WriteString("  " + line + "\n")
	}
	b.WriteString("\nCommands:\n")
	for _, c := range root.Commands() {
		if c.IsAvailableCommand() {
			fmt.Fprintf(&b, "  %-10s %s\n", c.Name(), c.Short)
		}
	}
	b.WriteString(`
Common flags (every command that reaches NATS or the store):
  --nats URL          NATS_URL, default nats://127.0.0.1:4222
  --config FILE       BOXCAR_CONFIG, the workers' config: its nats names (stream, subject,
                      consumer, buckets) and url, for a fleet that renames them
  --tenant TENANT     BOXCAR_TENANT, default default: whose jobs, statuses and approvals
  --store URL         BOXCAR_STORE, file:///path or s3://bucket[/prefix], default file://$BOXCAR_HOME/store
                      (BOXCAR_HOME default ~/.boxcar)
  --s3-endpoint URL   BOXCAR_S3_ENDPOINT, for S3-compatible services
  --s3-ca FILE        BOXCAR_S3_CA, CAs of the S3 endpoint's certificate (PEM)
  --nats-creds FILE   NATS_CREDS, a .creds file (user JWT and nkey seed)
  --nats-nkey FILE    NATS_NKEY, an nkey seed file
  --nats-user NAME    NATS_USER, with --nats-password-file FILE, NATS_PASSWORD_FILE or NATS_PASSWORD
  --nats-token-file FILE  NATS_TOKEN_FILE or NATS_TOKEN; default on this machine: the embedded
                      worker's token in $BOXCAR_HOME/nats.token
  --nats-ca FILE      NATS_CA, CAs of the NATS server's certificate (PEM)
  --nats-cert FILE, --nats-key FILE  NATS_CERT, NATS_KEY: a client certificate (mTLS)
  --output, -o FORMAT text or json; with json an error is one JSON object on stderr with a
                      stable "code" (see docs/cli.md)

Exit codes of run --wait and watch: 0 succeeded, 1 error or bad usage, 2 failed, 3 capped,
4 rejected (also run --profile that no live worker defines, or inputs over its
max_input_bytes), 5 cancelled, 6 dead (retries exhausted), 7 gave up waiting, 130 interrupted
(Ctrl-C; the job keeps running); of run also 9:
the server never confirmed the submission (the job id is printed; resubmit it with --id).
Exit codes of verify and get: 0 verified, 1 error (store unreachable, bad usage), 8 verification
failed (a file changed or missing, a bad signature, no valid manifest).

Run 'submit COMMAND --help' for a command's flags.
`)
	return b.String()
}

// Synopsis is one line per command, generated from the command tree: its arguments, then its
// flags (required ones bare, optional ones in brackets, repeatable ones followed by "...").
// The docs' usage block is this text; a test fails when the two drift.
func Synopsis(root *cobra.Command) string {
	width := 0
	for _, c := range root.Commands() {
		if c.IsAvailableCommand() {
			width = max(width, len(c.Name()))
		}
	}
	var b strings.Builder
	for _, c := range root.Commands() {
		if !c.IsAvailableCommand() {
			continue
		}
		line := "submit " + fmt.Sprintf("%-*s", width, c.Name())
		if _, args, ok := strings.Cut(c.Use, " "); ok {
			line += " " + args
		}
		var flags []string
		c.LocalFlags().VisitAll(func(f *pflag.Flag) {
			if f.Hidden || f.Name == "help" {
				return
			}
			if _, common := f.Annotations[commonFlag]; common && f.Name != "output" {
				return
			}
			if _, alt := f.Annotations[altSynopsis]; alt {
				return
			}
			flags = append(flags, flagSynopsis(f))
		})
		if len(flags) > 0 {
			line += " " + strings.Join(flags, " ")
		}
		b.WriteString(strings.TrimRight(line, " ") + "\n")
		if alt, ok := c.Annotations[altSynopsis]; ok {
			b.WriteString("submit " + fmt.Sprintf("%-*s", width, c.Name()) + " " + alt + "\n")
		}
	}
	return b.String()
}

func flagSynopsis(f *pflag.Flag) string {
	s := "--" + f.Name
	if name, _ := pflag.UnquoteUsage(f); f.Value.Type() != "bool" {
		s += " " + name
	}
	if _, required := f.Annotations[requiredFlag]; required {
		return s
	}
	s = "[" + s + "]"
	if strings.HasSuffix(f.Value.Type(), "Array") || strings.HasSuffix(f.Value.Type(), "Slice") {
		s += "..."
	}
	return s
}

// common adds the shared flags to c, bound to e. Commands that print something a script may
// read take --output too.
func (e *env) common(c *cobra.Command, output bool) {
	fs := c.Flags()
	fs.SortFlags = false
	fs.StringVar(&e.natsURL, "nats", "", "NATS `URL` (default $NATS_URL, else the --config's nats.url, else nats://127.0.0.1:4222)")
	fs.StringVar(&e.configPath, "config", "", "the workers' config `FILE`, whose nats names (stream, subject, consumer, buckets) and url to use (default $BOXCAR_CONFIG, else the default names)")
	fs.StringVar(&e.tenantFlag, "tenant", "", "the `TENANT` to act for: its jobs, statuses and approvals only; the NATS server's permissions say which the credentials may use (default $BOXCAR_TENANT, else default)")
	fs.StringVar(&e.storeURL, "store", "", "store `URL`: file:///path or s3://bucket[/prefix] (default $BOXCAR_STORE, else file://$BOXCAR_HOME/store)")
	fs.StringVar(&e.s3Endpoint, "s3-endpoint", "", "endpoint `URL` of an S3-compatible service (default $BOXCAR_S3_ENDPOINT)")
	fs.StringVar(&e.s3CA, "s3-ca", "", "PEM `FILE` of the CAs that sign the S3 endpoint's certificate (default $BOXCAR_S3_CA)")
	e.natsAuth.Bind(fs)
	names := append([]string{"nats", "config", "tenant", "store", "s3-endpoint", "s3-ca"}, e.natsAuth.Names()...)
	if output {
		e.outputFlag(c)
		names = append(names, "output")
	}
	for _, n := range names {
		_ = fs.SetAnnotation(n, commonFlag, []string{"true"})
	}
}

func (e *env) versionCmd() *cobra.Command {
	c := &cobra.Command{
		Use:   "version",
		Short: "the build: version, VCS revision, Go version",
		Args:  cli.Args(0, 0, "version: takes no arguments"),
		RunE: func(*cobra.Command, []string) error {
			w := provenance.WorkerInfo("")
			if e.json() {
				return e.printJSON(map[string]any{"version": w.Version, "vcs_revision": w.VCSRevision, "vcs_modified": w.VCSModified, "go_version": w.GoVersion})
			}
			_, err := fmt.Fprintln(e.stdout, "submit", w.String())
			return err
		},
	}
	e.outputFlag(c)
	return c
}

func (e *env) keygenCmd() *cobra.Command {
	var out string
	c := &cobra.Command{
		Use:   "keygen",
		Short: "write a new manifest signing key pair (signing.key, signing.pub)",
		Long: `Writes a new ed25519 key pair for signing manifests: DIR/signing.key (private, mode 0600; give it
to workers with --signing-key or signing_key, in a cluster as a mounted Secret) and
DIR/signing.pub (public; give it to whoever verifies, submit verify --public-key). Existing
files are never replaced. worker keygen does the same.`,
		Args: cli.Args(0, 0, "keygen: takes no arguments; give the folder with --out DIR"),
		RunE: func(*cobra.Command, []string) error {
			if out == "" {
				return cli.Usagef("keygen: --out DIR is required")
			}
			if e.json() {
				kp, err := provenance.WriteKeyPair(out)
				if err != nil {
					return err
				}
				return e.printJSON(map[string]any{"private_key": kp.PrivatePath, "public_key": kp.PublicPath, "key_id": kp.KeyID})
			}
			_, err := provenance.Keygen(out, e.stdout)
			return err
		},
	}
	c.Flags().StringVar(&out, "out", "", "folder to write signing.key (mode 0600) and signing.pub into (required; created 0700 if missing) (`DIR`)")
	markRequired(c, "out")
	_ = c.MarkFlagDirname("out")
	e.outputFlag(c)
	return c
}
