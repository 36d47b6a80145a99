package workercmd_test

import (
	"bytes"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/boxcar-run/boxcar/internal/cli"
	"github.com/boxcar-run/boxcar/internal/queue"
	"github.com/boxcar-run/boxcar/internal/queue/queuetest"
	"github.com/boxcar-run/boxcar/internal/workercmd"
)

// prefixWord is one word of an error's chain of prefixes ("worker: setup: queue: …").
var prefixWord = regexp.MustCompile(`^[a-z][a-z-]*( usage)?$`)

// doubledPrefix returns a prefix an error line says twice ("worker: bad usage: worker: …"), or "".
func doubledPrefix(line string) string {
	seen := map[string]bool{}
	for _, part := range strings.Split(line, ": ") {
		if !prefixWord.MatchString(part) {
			continue
		}
		if seen[part] {
			return part
		}
		seen[part] = true
	}
	return ""
}

// TestErrorTextSaysEachPrefixOnce: the worker's errors, printed as main prints them (the tool's
// name first), name each command and package once. A flag error of the root command read
// "worker: bad usage: worker: unknown flag: …": the flag error named the command the tool's
// name already names. Setup's own error says what failed and what to do, its chain once.
func TestErrorTextSaysEachPrefixOnce(t *testing.T) {
	t.Parallel()
	ns := queuetest.Start(t, queue.EmbeddedOptions{})
	env := map[string]string{"NATS_URL": ns.ClientURL()}
	getenv := func(k string) string { return env[k] }
	const config = "testdata/check-config/13-ok-tenants.yaml"
	for _, tc := range []struct {
		name string
		run  func() error
		want string
	}{
		{"root flag", func() error {
			return workercmd.Run(t.Context(), []string{"--frob"}, getenv, &bytes.Buffer{}, &bytes.Buffer{})
		},
			"worker: bad usage: unknown flag: --frob (see `worker --help`)\n"},
		{"setup flag", func() error {
			return workercmd.Run(t.Context(), []string{"setup", "--frob"}, getenv, &bytes.Buffer{}, &bytes.Buffer{})
		}, "worker: bad usage: setup: unknown flag: --frob (see `worker setup --help`)\n"},
		{"setup without its config", func() error {
			return workercmd.Run(t.Context(), []string{"setup"}, getenv, &bytes.Buffer{}, &bytes.Buffer{})
		},
			"worker: setup: --config FILE is required (the worker config: nats and tenants)\n"},
		{"setup with an argument", func() error {
			return workercmd.Run(t.Context(), []string{"setup", "--config", config, "x"}, getenv, &bytes.Buffer{}, &bytes.Buffer{})
		}, "worker: bad usage: setup: takes no arguments; give the config with --config FILE\n"},
		{"setup answered by nobody", func() error {
			return workercmd.SetupWithin(t.Context(), time.Nanosecond, config, getenv, &bytes.Buffer{}, &bytes.Buffer{})
		}, "worker: setup: queue: list the job streams: context deadline exceeded (NATS answered none of setup's requests within 1ns: is JetStream up and its meta leader elected (`nats server report jetstream`)? run setup again)\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, msg := cli.ExitCode(tc.run())
			var out bytes.Buffer
			cli.PrintError(&out, "worker", msg)
			if twice := doubledPrefix(strings.TrimSpace(out.String())); twice != "" || out.String() != tc.want {
				t.Errorf("prints %q (%q twice); want %q", out.String(), twice, tc.want)
			}
		})
	}
}
