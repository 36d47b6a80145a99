// Package cli owns what Boxcar's two command-line tools, worker and submit, share on top of
// cobra: the root command's settings and its help page hook, the version and completion
// commands, the --output flag, argument checks and usage errors, how an error ends the process,
// and the flag tables docs/cli.md carries. It knows nothing of jobs, NATS or the store;
// internal/workercmd and internal/submitcmd build their commands with it.
package cli

import (
	"errors"
	"fmt"
	"io"
	"sync"

	"github.com/spf13/cobra"

	"github.com/boxcar-run/boxcar/internal/provenance"
)

// KeepCommandOrder turns off cobra's sorting of commands, a package-level setting: once for the
// process, so two commands built at the same time (tests run them in parallel) never race on
// it. NewRoot calls it; a root built otherwise calls it first.
var KeepCommandOrder = sync.OnceFunc(func() { cobra.EnableCommandSorting = false })

// NewRoot returns the root command of the tool name with the settings both tools share:
// commands listed in the order they are added (the order a user meets them), errors and usage
// left to the caller (main prints the error once, see Exit), no default completion command
// (Completion adds one that writes the script byte for byte), `--version`, and a flag error
// that says where to look.
func NewRoot(name, short string, stdout, stderr io.Writer) *cobra.Command {
	KeepCommandOrder()
	root := &cobra.Command{
		Use:               name,
		Short:             short,
		Version:           provenance.WorkerInfo("").String(),
		SilenceErrors:     true,
		SilenceUsage:      true,
		CompletionOptions: cobra.CompletionOptions{DisableDefaultCmd: true},
	}
	root.SetOut(stdout)
	root.SetErr(stderr)
	root.SetVersionTemplate(name + " {{.Version}}\n")
	root.SetFlagErrorFunc(func(c *cobra.Command, err error) error {
		if !c.HasParent() {
			// main prints the tool's name before the error (PrintError): said here too, it
			// read "worker: bad usage: worker: unknown flag".
			return fmt.Errorf("%w: %w (see `%s --help`)", ErrUsage, err, c.CommandPath())
		}
		return fmt.Errorf("%w: %s: %w (see `%s --help`)", ErrUsage, c.Name(), err, c.CommandPath())
	})
	return root
}

// SetRootHelp makes `NAME --help` print help(root), the tool's own page; its commands keep
// cobra's help.
func SetRootHelp(root *cobra.Command, help func(root *cobra.Command) string) {
	defaultHelp := root.HelpFunc()
	root.SetHelpFunc(func(c *cobra.Command, args []string) {
		if c != root {
			defaultHelp(c, args)
			return
		}
		fmt.Fprint(c.OutOrStdout(), help(root))
	})
}

// ErrUsage marks bad usage: a wrong argument count, an unknown flag or command, a bad flag
// value (submit's error code "usage").
var ErrUsage = errors.New("bad usage")

// Usagef is a usage mistake in the command's own words, wrapping ErrUsage.
func Usagef(format string, a ...any) error {
	return fmt.Errorf("%w: %s", ErrUsage, fmt.Sprintf(format, a...))
}

// Args checks the number of positional arguments, failing with msg (the command's own words,
// e.g. "status: give one JOB_ID") as a usage error.
func Args(min, max int, msg string) cobra.PositionalArgs {
	return func(_ *cobra.Command, a []string) error {
		if len(a) < min || len(a) > max {
			return Usagef("%s", msg)
		}
		return nil
	}
}

// Version is the `version` command: the build (release version, VCS revision, Go version), the
// same fields every manifest records for the worker.
func Version(name string, stdout io.Writer) *cobra.Command {
	return &cobra.Command{
		Use:   "version",
		Short: "the build: version, VCS revision, Go version",
		Args:  Args(0, 0, "version: takes no arguments"),
		RunE: func(*cobra.Command, []string) error {
			_, err := fmt.Fprintln(stdout, name, provenance.WorkerInfo("").String())
			return err
		},
	}
}

// Completion is the `completion` command: a shell completion script cobra generates from the
// command tree, written to raw (the stream as given, unfiltered: a script, byte for byte).
func Completion(root *cobra.Command, raw func() io.Writer) *cobra.Command {
	name := root.Name()
	return &cobra.Command{
		Use:   "completion bash|zsh|fish",
		Short: "print a shell completion script",
		Long: fmt.Sprintf(`Prints a completion script for the shell. For example:
  bash:  source <(%[1]s completion bash)
  zsh:   %[1]s completion zsh > "${fpath[1]}/_%[1]s"
  fish:  %[1]s completion fish > ~/.config/fish/completions/%[1]s.fish`, name),
		ValidArgs: []string{"bash", "zsh", "fish"},
		Args:      Args(1, 1, "completion: give one shell: bash, zsh or fish"),
		RunE: func(_ *cobra.Command, a []string) error {
			w := raw()
			switch a[0] {
			case "bash":
				return root.GenBashCompletionV2(w, true)
			case "zsh":
				return root.GenZshCompletion(w)
			case "fish":
				return root.GenFishCompletion(w, true)
			}
			return Usagef("completion: %q is not a shell this supports; use bash, zsh or fish", a[0])
		},
	}
}
