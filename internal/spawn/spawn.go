// Package spawn starts child processes that die with this process, and only with it.
//
// Linux sends a child's parent-death signal (Pdeathsig) when the thread that forked it ends,
// not when the process does. Go ends a thread when a goroutine that locked it returns without
// unlocking, which this project does on purpose after a thread entered a network namespace or
// took a sandbox's ids, so that no other goroutine runs there. A child forked earlier from such
// a thread was killed with it: a test's versitygw died when a parallel test left its network
// namespace, and a job's sandbox could die when another job's rlimit call failed. So every
// start happens on one thread that is locked for the life of the process and never ends.
package spawn

import (
	"os/exec"
	"runtime"
	"sync"
	"syscall"
)

type request struct {
	cmd  *exec.Cmd
	done chan error
}

var (
	requests = make(chan request)
	starter  sync.Once
)

// Start starts cmd as cmd.Start does, with SIGKILL as its parent-death signal, from the
// process's one starting thread: the child is killed when this process ends, never before.
// The rest of cmd.SysProcAttr (credentials, process group) is kept.
func Start(cmd *exec.Cmd) error {
	starter.Do(func() { go startAll() })
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{}
	}
	cmd.SysProcAttr.Pdeathsig = syscall.SIGKILL
	done := make(chan error, 1)
	requests <- request{cmd: cmd, done: done}
	return <-done
}

// StarterFunc is the function of the goroutine that starts every child and runs as long as the
// process: leak checkers pass over it (goleak.IgnoreAnyFunction).
const StarterFunc = "github.com/boxcar-run/boxcar/internal/spawn.startAll"

func startAll() {
	// Never unlocked, and this goroutine never returns: no other goroutine runs on this thread,
	// so nothing can end it or change its namespaces or ids.
	runtime.LockOSThread()
	for r := range requests {
		r.done <- r.cmd.Start()
	}
}
