package spawn

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// startOnEndingThread starts a long sleep through start from a goroutine locked to its thread,
// ends that goroutine (and so the thread, as the worker does after leaving a namespace), and
// returns the child, and a channel closed when it has ended, once the thread is gone.
func startOnEndingThread(t *testing.T, start func(*exec.Cmd) error) (*exec.Cmd, <-chan struct{}) {
	t.Helper()
	cmd := exec.Command("sleep", "600")
	type started struct {
		tid int
		err error
	}
	c := make(chan started, 1)
	var s started
	for s.tid == 0 {
		go func() {
			runtime.LockOSThread()
			if unix.Gettid() == unix.Getpid() {
				// The main thread never ends (Go parks it instead): try another.
				runtime.UnlockOSThread()
				c <- started{}
				return
			}
			// Never unlocked: the thread ends with the goroutine.
			c <- started{tid: unix.Gettid(), err: start(cmd)}
		}()
		s = <-c
	}
	if s.err != nil {
		t.Fatalf("start sleep: %v", s.err)
	}
	ended := make(chan struct{})
	go func() { _ = cmd.Wait(); close(ended) }()
	t.Cleanup(func() { _ = cmd.Process.Kill(); <-ended })
	task := fmt.Sprintf("/proc/self/task/%d", s.tid)
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(10 * time.Millisecond) {
		if _, err := os.Stat(task); errors.Is(err, fs.ErrNotExist) {
			return cmd, ended
		}
		if time.Now().After(deadline) {
			t.Fatalf("the locked thread %d did not end within a minute", s.tid)
		}
	}
}

// exited waits up to d for ended to close and says whether it did.
func exited(ended <-chan struct{}, d time.Duration) bool {
	select {
	case <-ended:
		return true
	case <-time.After(d):
		return false
	}
}

// A child that the kernel would kill with the thread that forked it outlives that thread.
// The first row is what every start did before this package: it shows the test sees the kill.
func TestChildOutlivesTheThreadThatAskedForIt(t *testing.T) {
	t.Parallel()
	naive := func(cmd *exec.Cmd) error {
		cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
		return cmd.Start()
	}
	t.Run("cmd.Start with Pdeathsig dies with the thread", func(t *testing.T) {
		t.Parallel()
		if _, ended := startOnEndingThread(t, naive); !exited(ended, time.Minute) {
			t.Fatal("the child of an ended thread still runs; the kernel's parent-death signal did not come, so this test cannot tell Start from cmd.Start")
		}
	})
	t.Run("spawn.Start lives on", func(t *testing.T) {
		t.Parallel()
		cmd, ended := startOnEndingThread(t, Start)
		// Threads that end after the start must not take it either.
		for range 8 {
			done := make(chan struct{})
			go func() { runtime.LockOSThread(); close(done) }()
			<-done
		}
		if exited(ended, 500*time.Millisecond) {
			t.Fatalf("a child of spawn.Start died when the thread that asked for it ended: %v", cmd.ProcessState)
		}
	})
}

// The rest of SysProcAttr holds: a child asked for its own process group gets one.
func TestStartKeepsSysProcAttr(t *testing.T) {
	t.Parallel()
	cmd := exec.Command("sleep", "600")
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := Start(cmd); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }()
	pgid, err := syscall.Getpgid(cmd.Process.Pid)
	if err != nil || pgid != cmd.Process.Pid {
		t.Errorf("process group of a child started with Setpgid = %d, %v; want its own, %d", pgid, err, cmd.Process.Pid)
	}
	if cmd.SysProcAttr.Pdeathsig != syscall.SIGKILL {
		t.Errorf("Pdeathsig = %v, want SIGKILL", cmd.SysProcAttr.Pdeathsig)
	}
	if err := Start(exec.Command("/nonexistent/boxcar-spawn-test")); err == nil {
		t.Error("Start of a missing binary returned no error")
	}
}

const childEnv = "BOXCAR_SPAWN_TEST_CHILD"

// The parent-death signal still comes when the process ends: this test runs its own binary,
// which starts a sleep through Start, prints its pid and exits.
func TestChildDiesWithTheProcess(t *testing.T) {
	t.Parallel()
	if os.Getenv(childEnv) == "1" {
		cmd := exec.Command("sleep", "600")
		if err := Start(cmd); err != nil {
			fmt.Println("error:", err)
			os.Exit(1)
		}
		fmt.Println(cmd.Process.Pid)
		os.Exit(0)
	}
	parent := exec.Command(os.Args[0], "-test.run", "^TestChildDiesWithTheProcess$")
	parent.Env = append(os.Environ(), childEnv+"=1")
	out, err := parent.Output()
	if err != nil {
		t.Fatalf("run the test binary as the parent: %v\n%s", err, out)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(out)))
	if err != nil {
		t.Fatalf("the parent printed %q, want the child's pid", out)
	}
	for deadline := time.Now().Add(time.Minute); !gone(pid); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			_ = syscall.Kill(pid, syscall.SIGKILL)
			t.Fatalf("the child %d still ran a minute after its parent ended", pid)
		}
	}
}

// gone says whether pid has ended: it is no more, or a zombie no one has reaped yet (a
// container's init may not reap orphans).
func gone(pid int) bool {
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return true
	}
	// The state follows the command's closing parenthesis.
	i := strings.LastIndexByte(string(stat), ')')
	return i < 0 || i+2 >= len(stat) || stat[i+2] == 'Z' || stat[i+2] == 'X'
}

// Every start with a parent-death signal goes through Start: a Pdeathsig set anywhere else
// would die with its thread again.
func TestOnlySpawnSetsPdeathsig(t *testing.T) {
	t.Parallel()
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	var found []string
	err = filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (d.Name() == ".git" || d.Name() == "testdata" || strings.HasPrefix(d.Name(), ".")) && path != root {
			return filepath.SkipDir
		}
		if d.IsDir() || !strings.HasSuffix(path, ".go") || filepath.Dir(path) == filepath.Join(root, "internal", "spawn") {
			return nil
		}
		text, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		if strings.Contains(string(text), "Pdeathsig") {
			rel, _ := filepath.Rel(root, path)
			found = append(found, rel)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(found) > 0 {
		t.Errorf("these files set a parent-death signal themselves; start through spawn.Start instead: %s", strings.Join(found, ", "))
	}
}

// Leak checkers find the starting goroutine by the name StarterFunc gives.
func TestStarterFuncNamesTheStarter(t *testing.T) {
	t.Parallel()
	if name := runtime.FuncForPC(reflect.ValueOf(startAll).Pointer()).Name(); name != StarterFunc {
		t.Errorf("StarterFunc = %q, the starting goroutine runs %q", StarterFunc, name)
	}
}
