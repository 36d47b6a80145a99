package workercmd

import (
	"bytes"
	"context"
	"regexp"
	"strings"
	"testing"

	"github.com/spf13/pflag"
)

func noEnv(string) string { return "" }

// runWorker runs the worker command with args and an empty environment.
func runWorker(t *testing.T, args ...string) (stdout, stderr string, err error) {
	t.Helper()
	var out, errOut bytes.Buffer
	err = Run(t.Context(), args, noEnv, &out, &errOut)
	return out.String(), errOut.String(), err
}

// TestHelpListsEveryFlag: `worker --help` names each flag of the worker and each command.
func TestHelpListsEveryFlag(t *testing.T) {
	for _, args := range [][]string{{"--help"}, {"-h"}, {"help"}} {
		stdout, _, err := runWorker(t, args...)
		if err != nil {
			t.Fatalf("worker %s: %v", args[0], err)
		}
		want := []string{"usage: worker [flags]", "check-config FILE", "keygen --out DIR", "version", "completion bash|zsh|fish"}
		NewCommand(noEnv, &bytes.Buffer{}, &bytes.Buffer{}).Flags().VisitAll(func(f *pflag.Flag) {
			want = append(want, "--"+f.Name)
		})
		for _, s := range want {
			if !strings.Contains(stdout, s) {
				t.Errorf("worker %s does not mention %q:\n%s", args[0], s, stdout)
			}
		}
		// Each command's line keeps its usage and its summary apart by two spaces or more.
		for _, c := range NewCommand(noEnv, &bytes.Buffer{}, &bytes.Buffer{}).Commands() {
			if c.IsAvailableCommand() && !strings.Contains(stdout, "  "+c.Use+"  ") {
				t.Errorf("worker %s runs command %q into its summary:\n%s", args[0], c.Use, stdout)
			}
		}
	}
}

func TestVersion(t *testing.T) {
	for _, args := range [][]string{{"version"}, {"--version"}, {"-version"}} {
		stdout, _, err := runWorker(t, args...)
		if err != nil || !regexp.MustCompile(`^worker \S+ .*\n$`).MatchString(stdout) || strings.Count(stdout, "\n") != 1 {
			t.Errorf("worker %s = %q, %v; want one line: worker VERSION …", args[0], stdout, err)
		}
	}
}

// TestUsageErrors: bad flags and arguments fail at once with a message that says what to give,
// before anything starts (no NATS, no store: the environment is empty).
func TestUsageErrors(t *testing.T) {
	tests := []struct {
		name string
		args []string
		want string
	}{
		{"no config", nil, "no --config"},
		{"unknown flag", []string{"--frob"}, "unknown flag: --frob (see `worker --help`)"},
		{"argument", []string{"--config", "x.yaml", "extra"}, `unknown command "extra"`},
		{"missing file", []string{"--config", "/nonexistent/boxcar.yaml"}, "/nonexistent/boxcar.yaml"},
		{"single-dash flag of the flag package", []string{"-config", "/nonexistent/boxcar.yaml"}, "/nonexistent/boxcar.yaml"},
		{"single-dash flag with a value", []string{"-config=/nonexistent/boxcar.yaml"}, "/nonexistent/boxcar.yaml"},
		{"bad log level", []string{"--embedded", "--log-level", "loud"}, "--log-level"},
		{"keygen without --out", []string{"keygen"}, "keygen: --out DIR is required"},
		{"keygen argument", []string{"keygen", "--out", "x", "y"}, "keygen: takes no arguments"},
		{"check-config without a file", []string{"check-config"}, "check-config: give one config FILE"},
		{"version argument", []string{"version", "x"}, "version: takes no arguments"},
		{"completion shell", []string{"completion", "tcsh"}, "bash, zsh or fish"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ctx, cancel := context.WithCancel(t.Context())
			cancel() // a worker that got past its checks stops at once instead of waiting
			err := Run(ctx, tt.args, noEnv, &bytes.Buffer{}, &bytes.Buffer{})
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("worker %q: %v; want an error with %q", tt.args, err, tt.want)
			}
		})
	}
}

func TestCompletion(t *testing.T) {
	stdout, _, err := runWorker(t, "completion", "bash")
	if err != nil || !strings.Contains(stdout, "__start_worker") {
		t.Errorf("completion bash: %v; want a script for worker, got %d bytes", err, len(stdout))
	}
	stdout, _, err = runWorker(t, "__complete", "--log")
	if err != nil || !strings.Contains(stdout, "--log-level") {
		t.Errorf("completing --log: %v\n%s", err, stdout)
	}
}
