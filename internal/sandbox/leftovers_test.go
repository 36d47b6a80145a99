//go:build integration

package sandbox_test

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/boxcar-run/boxcar/internal/config"
	"github.com/boxcar-run/boxcar/internal/sandbox"
	"github.com/boxcar-run/boxcar/internal/sandbox/sandboxtest"
)

// crashWorkerEnv makes the test binary act as a worker that crashes: see crashWorker.
const crashWorkerEnv = "BOXCAR_TEST_CRASH_WORKER_ROOT"

// The re-executed test binary becomes the crashing worker before TestMain runs any test.
func init() {
	if root := os.Getenv(crashWorkerEnv); root != "" {
		crashWorker(root)
		os.Exit(0)
	}
}

// crashWorker is a worker process (the test binary, started by TestBubblewrapRemovesCrashLeftovers):
// it starts a sandbox over root with a command running in it and the warm sandboxes of
// crashPools, prints their host states as JSON and waits to be killed.
func crashWorker(root string) {
	fail := func(err error) {
		fmt.Fprintln(os.Stderr, "crash worker:", err)
		os.Exit(2)
	}
	p, err := sandbox.NewBubblewrap(sandbox.BubblewrapConfig{Root: root})
	if err != nil {
		fail(err)
	}
	ctx := context.Background()
	sb, err := p.Start(ctx, sandboxtest.Spec("crashed-job", config.SandboxSpec{}))
	if err != nil {
		fail(err)
	}
	if err := sb.WriteFile(ctx, "in/work.txt", []byte("half done")); err != nil {
		fail(err)
	}
	go func() {
		_, _ = sb.Exec(ctx, sandbox.ExecRequest{Argv: []string{"sh", "-c", "echo > running; chmod 0500 in; sleep 1000"}})
	}()
	for {
		if _, err := sb.ReadFile(ctx, "running", 10); err == nil {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	states := []sandbox.HostState{sandbox.BubblewrapHostState(sb)}
	for _, profile := range crashPools {
		spec := sandboxtest.Spec("", config.SandboxSpec{})
		spec.Pool, spec.Ahead = profile, time.Hour
		warm, err := p.Start(ctx, spec)
		if err != nil {
			fail(err)
		}
		states = append(states, sandbox.BubblewrapHostState(warm))
	}
	if err := json.NewEncoder(os.Stdout).Encode(states); err != nil {
		fail(err)
	}
	select {} // until killed
}

// crashPools are the profiles whose warm sandboxes the crashing worker holds: a pool
// sandbox's id has its own prefix, and a profile's name may be as long as safeID keeps.
var crashPools = []string{
	"short",
	"a-profile-name-long-enough-to-fill-the-whole-id",
}

// startCrashWorker runs crashWorker in a process of its own, kills it once its sandbox runs, and
// returns what its sandboxes left.
func startCrashWorker(t *testing.T, root string) []sandbox.HostState {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), crashWorkerEnv+"="+root)
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var st []sandbox.HostState
	if err := json.NewDecoder(bufio.NewReader(out)).Decode(&st); err != nil {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		t.Fatalf("crash worker: %v", err)
	}
	// The crash: no Close, no deferred cleanup.
	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = cmd.Wait()
	return st
}

// TestBubblewrapRemovesCrashLeftovers kills a worker while its sandbox runs a command, and checks
// that the next worker on the same Root removes what it left (workdir, cgroups, lock file, and
// a process still in the cgroup), and nothing else: not a live sandbox of another worker, not
// folders or files that are not Boxcar's, not what a damaged lock file names.
func TestBubblewrapRemovesCrashLeftovers(t *testing.T) {
	root := sandboxtest.SearchableTempDir(t)

	live := sandboxtest.StartSpec(t, sandboxtest.Bubblewrap(t, func(c *sandbox.BubblewrapConfig) { c.Root = root }), config.SandboxSpec{})
	liveState := sandbox.BubblewrapHostState(live)

	states := startCrashWorker(t, root)
	left := states[0] // the job's sandbox, with a command running
	var leftPaths []string
	for _, st := range states {
		leftPaths = append(leftPaths, st.Paths()...)
	}
	for _, path := range leftPaths {
		if _, err := os.Stat(path); err != nil {
			t.Fatalf("the crash left no %s (%v); the test shows nothing", path, err)
		}
	}
	// A process that outlived its worker, in the sandbox's cgroups.
	survivor := exec.Command("sleep", "1000")
	if err := survivor.Start(); err != nil {
		t.Fatal(err)
	}
	survived := make(chan error, 1)
	go func() { survived <- survivor.Wait() }()
	t.Cleanup(func() { _ = survivor.Process.Kill() })
	for _, dir := range left.Cgroups {
		if err := os.WriteFile(filepath.Join(dir, "cgroup.procs"), []byte(strconv.Itoa(survivor.Process.Pid)), 0); err != nil {
			t.Fatalf("move a survivor into %s: %v", dir, err)
		}
	}

	// Things that are not a dead worker's sandbox.
	victim := t.TempDir()
	if err := os.WriteFile(filepath.Join(victim, "keep"), []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	foreign := map[string]string{ // none of these may be removed
		"notes.txt":                   "file",
		"boxcar-no-lock-0123abcd":     "dir",  // Boxcar's naming, but no lock file says whose
		"boxcar-not-a-dir-0123abcd":   "file", // a file where a dead sandbox's workdir would be
		"boxcar-other.lock":           "file", // a lock file not of Boxcar's naming
		"boxcar-linked-0123abcd.lock": "symlink",
	}
	dead := map[string]string{ // lock files of dead workers' sandboxes, with nothing else left
		"boxcar-not-a-dir-0123abcd.lock": "",
		// A damaged one, naming what is not a cgroup of its sandbox.
		"boxcar-damaged-0123abcd.lock": "cgroup " + victim + "\ncgroup /\ncgroup ../../etc\ncgroup /sys/fs/cgroup\n",
	}
	for name, kind := range foreign {
		path := filepath.Join(root, name)
		var err error
		switch kind {
		case "file":
			err = os.WriteFile(path, []byte("not Boxcar's"), 0o600)
		case "dir":
			if err = os.Mkdir(path, 0o700); err == nil {
				err = os.WriteFile(filepath.Join(path, "keep"), nil, 0o600)
			}
		case "symlink":
			err = os.Symlink(filepath.Join(victim, "keep"), path)
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	for name, content := range dead {
		if err := os.WriteFile(filepath.Join(root, name), []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
	}

	// The next worker starts.
	sandboxtest.Bubblewrap(t, func(c *sandbox.BubblewrapConfig) { c.Root = root })

	for _, path := range leftPaths {
		if _, err := os.Lstat(path); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s is still there after the next start (%v)", path, err)
		}
	}
	select {
	case <-survived:
	case <-time.After(5 * time.Second):
		t.Errorf("the process left in the sandbox's cgroups still runs")
	}
	for name := range foreign {
		if _, err := os.Lstat(filepath.Join(root, name)); err != nil {
			t.Errorf("%s was removed, but it is not a dead worker's sandbox: %v", name, err)
		}
	}
	for name := range dead {
		if _, err := os.Lstat(filepath.Join(root, name)); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("the dead sandbox's lock file %s is still there (%v)", name, err)
		}
	}
	if _, err := os.Stat(filepath.Join(victim, "keep")); err != nil {
		t.Errorf("a file a damaged lock file points at was removed: %v", err)
	}
	for _, path := range liveState.Paths() {
		if _, err := os.Stat(path); err != nil {
			t.Errorf("the live sandbox of another worker lost %s: %v", path, err)
		}
	}
	if res := run(t, live, "sh", "-c", "echo still here"); string(res.Stdout) != "still here\n" {
		t.Errorf("the live sandbox no longer works: %+v", res)
	}
}
