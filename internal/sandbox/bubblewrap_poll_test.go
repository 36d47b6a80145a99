//go:build integration

package sandbox_test

import (
	"testing"
	"time"

	"github.com/boxcar-run/boxcar/internal/config"
	"github.com/boxcar-run/boxcar/internal/sandbox"
	"github.com/boxcar-run/boxcar/internal/sandbox/sandboxtest"
)

// TestBubblewrapOnePollPerCommand: a running command's workdir and, where bwrap makes them, its
// /tmp and /dev/shm are read by one poll loop, which wakes at most once per diskPollMin. Each
// bound had a loop of its own: a walked workdir's command woke the worker twice as often
// (about 80 times a second). A ticker under load drops wake-ups, never adds them, so the
// bound holds on a busy machine.
func TestBubblewrapOnePollPerCommand(t *testing.T) {
	t.Parallel()
	for _, disk := range diskModes {
		t.Run(disk.name, func(t *testing.T) {
			t.Parallel()
			sb := sandboxtest.StartSpec(t, sandboxtest.Bubblewrap(t, disk.edit), config.SandboxSpec{Disk: "16Mi"})
			before := sandbox.PollWakeups(sb)
			res, err := sb.Exec(t.Context(), sandbox.ExecRequest{Argv: []string{"sleep", "1"}, Timeout: time.Minute})
			if err != nil || res.ExitCode != 0 {
				t.Fatalf("sleep 1: exit %d, %v", res.ExitCode, err)
			}
			woke := sandbox.PollWakeups(sb) - before
			most := int64(res.Duration/sandbox.DiskPollMin) + 1
			t.Logf("%d wake-ups in %v (at most %d)", woke, res.Duration, most)
			if woke > most {
				t.Errorf("the command's disk polls woke %d times in %v, more than once per %v (%d)", woke, res.Duration, sandbox.DiskPollMin, most)
			}
			if woke == 0 {
				t.Errorf("the command's disk poll never woke in %v", res.Duration)
			}
		})
	}
}
