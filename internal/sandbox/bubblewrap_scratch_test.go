//go:build integration

package sandbox

import (
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestScratchWatchReadsOnlyTheSandboxsMounts: until bwrap has set up the command's mounts, its
// child's root is the worker's own, where /tmp and /dev/shm may be tmpfs full of the host's
// files; the watch read them there and could kill a command at its start for the host's files.
// Here the "bwrap" is a shell whose child, sleep, has the worker's root and the host's
// /dev/shm: the watch must not read it.
func TestScratchWatchReadsOnlyTheSandboxsMounts(t *testing.T) {
	t.Parallel()
	if _, err := os.Stat("/dev/shm"); err != nil {
		t.Fatalf("this test reads the host's /dev/shm: %v", err)
	}
	cmd := exec.CommandContext(t.Context(), "sh", "-c", "sleep 60; true")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	sh := cmd.Process.Pid
	children := filepath.Join("/proc", strconv.Itoa(sh), "task", strconv.Itoa(sh), "children")
	for {
		b, err := os.ReadFile(children)
		if err != nil {
			t.Fatal(err)
		}
		if strings.TrimSpace(string(b)) != "" {
			break
		}
		time.Sleep(5 * time.Millisecond) // the shell forks at once
	}
	w := &scratchWatch{bwrap: sh}
	defer w.close()
	if n, ok := w.inodes(); ok {
		t.Errorf("the watch read %d inodes on the host's own /tmp or /dev/shm, through a child whose root is the worker's", n)
	}
}
