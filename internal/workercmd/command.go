package workercmd

import (
	"context"
	"fmt"
	"io"
	"strings"

	"github.com/spf13/cobra"

	"github.com/boxcar-run/boxcar/internal/cli"
	"github.com/boxcar-run/boxcar/internal/provenance"
)

// Run is the whole worker command; main only adds signals and the exit code. Tests call it
// directly. With no command it runs the worker (`worker --config FILE`, `worker --embedded`).
func Run(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	root := NewCommand(getenv, stdout, stderr)
	if args == nil {
		args = []string{} // cobra reads os.Args when given nil
	}
	if len(args) > 0 && args[0] == "-version" {
		args = append([]string{"version"}, args[1:]...)
	}
	root.SetArgs(longDashes(args, root.Flags()))
	return root.ExecuteContext(ctx)
}

// NewCommand builds the worker's command tree: the worker itself, check-config, keygen,
// version and completion. Each call builds a fresh tree, so flag values never leak from one
// run into the next. docs/cli.md's flag table is generated from it.
func NewCommand(getenv func(string) string, stdout, stderr io.Writer) *cobra.Command {
	o := Options{Getenv: getenv, Stdout: stdout, Stderr: stderr}
	root := cli.NewRoot("worker", "run Boxcar jobs from NATS JetStream", stdout, stderr)
	root.Args = cobra.NoArgs
	bindFlags(root.Flags(), &o)
	root.RunE = func(c *cobra.Command, _ []string) error {
		w, err := Start(c.Context(), o)
		if err != nil {
			return err
		}
		return w.Wait()
	}
	root.AddCommand(
		checkConfigCmd(getenv, stdout),
		setupCmd(getenv, stdout, stderr),
		keygenCmd(stdout),
		natsConfigCmd(stdout),
		cli.Version("worker", stdout),
		cli.Completion(root, func() io.Writer { return stdout }),
	)
	cli.SetRootHelp(root, rootHelp)
	return root
}

// rootHelp is `worker --help`: the two ways to run it, the commands, the flags (from the flag
// set, so it cannot drift) and the environment.
func rootHelp(root *cobra.Command) string {
	var b strings.Builder
	b.WriteString(`usage: worker [flags]
       worker COMMAND

Runs Boxcar jobs from NATS JetStream.

  worker --embedded                 one machine: NATS in-process on 127.0.0.1:4222, file store and
                                    bubblewrap sandboxes under the data dir, example profiles
  worker --config boxcar.yaml       connect to NATS (NATS_URL) and the store of the config

Commands:
`)
	width := 0
	for _, c := range root.Commands() {
		width = max(width, len(c.Use))
	}
	for _, c := range root.Commands() {
		if c.IsAvailableCommand() {
			fmt.Fprintf(&b, "  %-*s  %s\n", width, c.Use, c.Short)
		}
	}
	b.WriteString("\nFlags:\n")
	b.WriteString(root.Flags().FlagUsages())
	b.WriteString(`
Environment: OPENAI_API_KEY, OPENAI_BASE_URL (the model), NATS_URL, BOXCAR_STORE, BOXCAR_HOME.

Run 'worker COMMAND --help' for a command's flags.
`)
	return b.String()
}

// keygenCmd is `worker keygen`, the same as `submit keygen`: one implementation, in provenance.
func keygenCmd(stdout io.Writer) *cobra.Command {
	var out string
	c := &cobra.Command{
		Use:   "keygen --out DIR",
		Short: "write a new manifest signing key pair (signing.key, signing.pub)",
		Long: `Writes a new ed25519 key pair for signing manifests: DIR/signing.key (private, mode 0600; give it
to workers with --signing-key or signing_key, in a cluster as a mounted Secret) and
DIR/signing.pub (public; give it to whoever verifies, submit verify --public-key). Existing
files are never replaced.`,
		Args: cli.Args(0, 0, "keygen: takes no arguments; give the folder with --out DIR"),
		RunE: func(*cobra.Command, []string) error {
			if out == "" {
				return fmt.Errorf("keygen: --out DIR is required")
			}
			_, err := provenance.Keygen(out, stdout)
			return err
		},
	}
	c.Flags().StringVar(&out, "out", "", "`DIR` to write signing.key (mode 0600) and signing.pub into (required; created 0700 if missing)")
	_ = c.MarkFlagDirname("out")
	return c
}
