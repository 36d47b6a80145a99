package cli_test

import (
	"bytes"
	"errors"
	"fmt"
	"sync"
	"testing"

	"github.com/spf13/cobra"

	"github.com/boxcar-run/boxcar/internal/cli"
)

// TestRootsInParallel builds and runs command trees at the same time, as parallel tests of
// worker and submit do: under -race it fails if building a root writes cobra's package-level
// sorting flag while another tree reads it.
func TestRootsInParallel(t *testing.T) {
	t.Parallel()
	var wg sync.WaitGroup
	for i := range 8 {
		wg.Go(func() {
			var out bytes.Buffer
			root := cli.NewRoot(fmt.Sprintf("tool%d", i), "a tool", &out, &out)
			root.AddCommand(&cobra.Command{Use: "zeta", Run: func(*cobra.Command, []string) {}}, cli.Version("tool", &out))
			root.SetArgs([]string{"--help"})
			if err := root.Execute(); err != nil {
				t.Error(err)
			}
			if cmds := root.Commands(); cmds[0].Name() != "zeta" {
				t.Errorf("commands %v, want them in the order added", cmds)
			}
		})
	}
	wg.Wait()
}

func TestPrintError(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name, msg, want string
	}{
		{"none", "", ""},
		{"one line", "config: open x: no such file", "worker: config: open x: no such file\n"},
		{"each line its own", "a.yaml:1:1 x: bad\na.yaml:2:3 y: bad\n", "worker: a.yaml:1:1 x: bad\nworker: a.yaml:2:3 y: bad\n"},
		{"escapes", "key \x1b[2J\u202e\ttab", `worker: key \u001b[2J\u202e\ttab` + "\n"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var b bytes.Buffer
			cli.PrintError(&b, "worker", tt.msg)
			if b.String() != tt.want {
				t.Errorf("PrintError(%q) wrote %q, want %q", tt.msg, b.String(), tt.want)
			}
		})
	}
}

func TestExitCode(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name     string
		err      error
		code     int
		wantText string
	}{
		{"nil", nil, 0, ""},
		{"plain", errors.New("boom"), 1, "boom"},
		{"exit error", fmt.Errorf("wrapped: %w", &cli.ExitError{Code: 7, Msg: "gave up"}), 7, "gave up"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			code, msg := cli.ExitCode(tt.err)
			if code != tt.code || msg != tt.wantText {
				t.Errorf("ExitCode(%v) = %d, %q; want %d, %q", tt.err, code, msg, tt.code, tt.wantText)
			}
		})
	}
}

func TestCheckOutput(t *testing.T) {
	t.Parallel()
	for v, ok := range map[string]bool{"": true, "text": true, "json": true, "yaml": false, "JSON": false} {
		if err := cli.CheckOutput(v); (err == nil) != ok {
			t.Errorf("CheckOutput(%q) = %v", v, err)
		}
	}
}
