package sandbox

import (
	"context"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/boxcar-run/boxcar/internal/sandbox/spare"
	"github.com/boxcar-run/boxcar/internal/spawn"
)

var _ Warmer = (*bubblewrapSandbox)(nil)

// spareBwrap is a bwrap started ahead of a pool sandbox's first command (package spare): its
// namespaces made, its rlimits set, in the sandbox's cgroup, under the seccomp filter, and the
// helper inside waiting for the command. The first Exec after the claim hands it the command
// instead of starting bwrap, which is most of a command's start. Only the first command has
// one, so that a warm sandbox holds no process a cold one lacks once the job runs.
//
// Inside the bwrap waits the sandbox's own /bin/sh running spare.Script where that shell is dash
// and the root the host's (the shell spare: one thread, so the command's execve waits for no
// other), else the worker's binary (spare.Arg; an image's root may have no shell, or another).
//
// A spare costs more to start than the bwrap of a command (it starts the shell or the worker's
// binary as well), so it pays only when it is ready before the first command comes: the pool
// starts it (Warm) once the sandbox waits for a job, not for a job that already waits for the
// sandbox, and the first command never waits for one that is still starting (takeSpare).
type spareBwrap struct {
	cmd            *exec.Cmd
	request, stdin *os.File // the worker's ends: the command to run (nil for the shell: stdin), and its input
	stdout, stderr *cappedBuffer
	shell          bool          // /bin/sh runs spare.Script (else the worker's binary)
	bridged        bool          // started with the egress binds, for a command behind the bridge
	ready          chan struct{} // closed once the helper answered or died
	ok             bool          // the helper is waiting (set before ready closes)
	killed         atomic.Bool
}

// Warm starts the spare of a pool sandbox, unless its first command came already. The channel
// closes once the spare is ready or has failed; a sandbox not started for a pool has none, and
// its channel is closed. So has a sandbox bounded by RLIMIT_AS (no memory cgroup) that cannot
// have the shell spare: the Go helper's runtime reserves more address space than a profile's
// memory, and would crash.
func (s *bubblewrapSandbox) Warm() <-chan struct{} {
	if s.pooled && (s.shellSpare() || !slices.ContainsFunc(s.rlimits, func(r rlimit) bool { return r.resource == unix.RLIMIT_AS })) {
		s.startSpare(false)
	}
	s.spareMu.Lock()
	defer s.spareMu.Unlock()
	if s.spare == nil {
		return closedChan
	}
	return s.spare.ready
}

var closedChan = func() chan struct{} {
	c := make(chan struct{})
	close(c)
	return c
}()

// startSpare starts the spare of a pool sandbox, in the background; the sandbox holds at most
// one. A spare that cannot start is no failure: the first command starts bwrap as usual.
func (s *bubblewrapSandbox) startSpare(bridged bool) {
	s.spareMu.Lock()
	defer s.spareMu.Unlock()
	if s.spare != nil || s.spareUsed {
		return
	}
	sp, err := s.launchSpare(bridged)
	if err != nil {
		s.log.Debug("no spare bwrap; the first command starts its own", "error", err)
		return
	}
	s.spare = sp
}

func (s *bubblewrapSandbox) launchSpare(bridged bool) (*spareBwrap, error) {
	inv, err := s.prepare()
	if err != nil {
		return nil, err
	}
	defer inv.close()
	p, err := pipes(3)
	if err != nil {
		return nil, err
	}
	reqR, reqW, readyR, readyW, stdinR, stdinW := p[0], p[1], p[2], p[3], p[4], p[5]
	sp := &spareBwrap{request: reqW, stdin: stdinW, stdout: &cappedBuffer{}, stderr: &cappedBuffer{}, bridged: bridged,
		ready: make(chan struct{})}
	var argv []string
	if s.shellSpare() {
		sp.shell, sp.request = true, nil
		reqR.Close()
		reqW.Close()
		argv, err = shellSpareArgv(inv, readyW)
	} else {
		argv, err = s.goSpareArgv(inv, reqR, readyW)
	}
	if err != nil {
		for _, f := range []*os.File{readyR, readyW, stdinR, stdinW} {
			f.Close()
		}
		return nil, err
	}
	sp.cmd = exec.Command(s.p.bwrap, append([]string{"--args", strconv.Itoa(fdArgs), "--"}, argv...)...) //nolint:noctx // killed by its owner (Exec's ctx, or the sandbox's close)
	sp.cmd.Env = []string{}
	sp.cmd.Dir = "/"
	sp.cmd.Stdin, sp.cmd.Stdout, sp.cmd.Stderr = stdinR, sp.stdout, sp.stderr
	sp.cmd.ExtraFiles = inv.child
	sp.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Credential: s.cred}
	sp.cmd.WaitDelay = waitDelay
	err = spawn.Start(sp.cmd)
	stdinR.Close()
	inv.closeChildEnds() // the request's and ready's ends, and the binary, too: the helper holds them now
	if err == nil {
		err = s.release(inv, sp.cmd.Process.Pid, s.spareOptions(bridged))
		if err != nil {
			sp.kill()
		}
	}
	if err != nil {
		readyR.Close()
		if sp.request != nil {
			sp.request.Close()
		}
		stdinW.Close()
		if sp.cmd.Process != nil {
			_ = sp.cmd.Wait()
		}
		return nil, fmt.Errorf("start a spare bwrap: %w", err)
	}
	go func() {
		var b [1]byte
		n, _ := readyR.Read(b[:])
		readyR.Close()
		sp.ok = n == 1
		close(sp.ready)
	}()
	return sp, nil
}

// shellSpare reports whether the sandbox's spare is its /bin/sh: where the root is the host's
// and the host's /bin/sh is dash, whose environment, descriptors and builtins spare.Script is
// written for (bash, for one, exports SHLVL and _ to the command).
func (s *bubblewrapSandbox) shellSpare() bool {
	_, goOnly := goSpareOnly.Load(s.p)
	return s.image == "" && !goOnly && hostShellIsDash()
}

// goSpareOnly holds the providers whose sandboxes have the Go spare even where the shell spare
// would do: tests of the Go spare on the host's root.
var goSpareOnly sync.Map

var hostShellIsDash = sync.OnceValue(func() bool {
	sh, err := filepath.EvalSymlinks("/bin/sh")
	return err == nil && filepath.Base(sh) == "dash"
})

// shellSpareArgv passes ready at spare.ReadyFD, after the sandbox's own descriptors (a shell
// redirects none above 9), and is the shell's command line.
func shellSpareArgv(inv *invocation, ready *os.File) ([]string, error) {
	at := spare.ReadyFD - fdArgs
	if len(inv.child) > at {
		ready.Close()
		return nil, fmt.Errorf("the sandbox passes bwrap %d descriptors; the shell spare's must be fd %d", len(inv.child), spare.ReadyFD)
	}
	for len(inv.child) < at {
		inv.child = append(inv.child, nil) // closed in bwrap
	}
	inv.child = append(inv.child, ready)
	return []string{"/bin/sh", "-c", spare.Script}, nil
}

// goSpareArgv passes the request's and ready's ends and the worker's binary, and is the
// binary's command line.
func (s *bubblewrapSandbox) goSpareArgv(inv *invocation, req, ready *os.File) ([]string, error) {
	bin, err := s.openSpareBin()
	if err != nil {
		req.Close()
		ready.Close()
		return nil, err
	}
	base := fdArgs + len(inv.child)
	inv.child = append(inv.child, req, ready, bin)
	return []string{"/proc/self/fd/" + strconv.Itoa(base+2), spare.Arg, strconv.Itoa(base), strconv.Itoa(base + 1)}, nil
}

func (s *bubblewrapSandbox) openSpareBin() (*os.File, error) {
	if err := s.p.loadBridge(s.image != ""); err != nil {
		return nil, err
	}
	return os.Open(s.p.bridgeBin)
}

// spareOptions are the sandbox's bwrap options for the helper: the command's environment and
// folder come later, through the helper.
func (s *bubblewrapSandbox) spareOptions(bridged bool) []byte {
	return s.options(ExecRequest{}, s.workdir, bridged, true)
}

func (sp *spareBwrap) kill() {
	sp.killed.Store(true)
	if sp.cmd.Process != nil {
		_ = syscall.Kill(-sp.cmd.Process.Pid, syscall.SIGKILL)
	}
}

// exited reports whether the spare's bwrap has ended, without reaping it (its Wait does): the
// process is the worker's unreaped child until then, so its pid names no other.
func (sp *spareBwrap) exited() bool {
	var info unix.Siginfo
	err := unix.Waitid(unix.P_PID, sp.cmd.Process.Pid, &info, unix.WEXITED|unix.WNOHANG|unix.WNOWAIT, nil)
	return err != nil || info.Signo != 0 // a waitable child fills in SIGCHLD; none leaves it zero
}

// discard ends a spare nobody took, and waits for it.
func (sp *spareBwrap) discard() {
	sp.kill()
	if sp.request != nil {
		sp.request.Close()
	}
	sp.stdin.Close()
	<-sp.ready
	_ = sp.cmd.Wait()
}

// takeSpare hands the first command the sandbox's spare if it is ready, still runs and was
// started for the same egress state. One still starting is discarded, in the background,
// rather than waited for: what it has left to do (the worker's binary starting) takes longer
// under load than the bwrap the command starts instead (docs/performance.md, row 15). One that
// died, before it was ready or while the sandbox waited for its job (the host's OOM killer, an
// operator's kill), or does not match is discarded too: handed the command, a dead spare
// reported it killed (exit 137, no output) without running it.
func (s *bubblewrapSandbox) takeSpare(bridged bool) *spareBwrap {
	s.spareMu.Lock()
	defer s.spareMu.Unlock()
	sp := s.spare
	s.spare, s.spareUsed = nil, true
	if sp == nil {
		return nil
	}
	select {
	case <-sp.ready:
		if sp.ok && sp.bridged == bridged && !sp.exited() {
			s.spareHit = true
			return sp
		}
	default:
	}
	s.spareGone.Add(1)
	go func() {
		defer s.spareGone.Done()
		sp.discard()
	}()
	return nil
}

// dropSpare discards the spare, if any, for good, and waits for those discarded before: the
// sandbox is closing.
func (s *bubblewrapSandbox) dropSpare() {
	s.spareMu.Lock()
	sp := s.spare
	s.spare, s.spareUsed = nil, true
	s.spareMu.Unlock()
	if sp != nil {
		sp.discard()
	}
	s.spareGone.Wait()
}

// renewSpare replaces a spare started before egress was attached with one that has its binds.
func (s *bubblewrapSandbox) renewSpare() {
	s.spareMu.Lock()
	sp := s.spare
	s.spare = nil
	s.spareMu.Unlock()
	if sp == nil {
		return
	}
	sp.discard()
	s.startSpare(true)
}

// launchOnSpare hands req to the spare: its output capped at maxOut, its input fed, and
// runCtx's end killing it as it kills a fresh bwrap. An error means the spare cannot take the
// command (a request its shell could not be told); it has been discarded.
func (s *bubblewrapSandbox) launchOnSpare(runCtx context.Context, sp *spareBwrap, req ExecRequest, chdir string, maxOut int, argv []string) (*launched, error) {
	request, err := s.spareRequest(sp, req, chdir, argv)
	if err != nil {
		sp.discard()
		s.spareMu.Lock()
		s.spareHit = false
		s.spareMu.Unlock()
		return nil, err
	}
	for _, b := range []*cappedBuffer{sp.stdout, sp.stderr} {
		b.mu.Lock()
		b.max = maxOut
		b.mu.Unlock()
	}
	l := &launched{cmd: sp.cmd, stdout: sp.stdout, stderr: sp.stderr, killed: &sp.killed, start: time.Now()}
	stop := context.AfterFunc(runCtx, sp.kill)
	// The shell reads its request from stdin, and leaves the rest to the command. The request
	// is written here, not by the feed: a goroutine more to schedule before the command starts.
	to := sp.request
	if sp.shell {
		to = sp.stdin
	}
	_, _ = to.Write(request) // a spare that died reports as the command
	if !sp.shell {
		sp.request.Close()
	}
	fed := make(chan struct{})
	go func() {
		defer close(fed)
		if req.Stdin != nil {
			_, _ = sp.stdin.Write(req.Stdin)
		}
		sp.stdin.Close()
	}()
	l.after = func() {
		stop()
		sp.stdin.Close() // unblocks a feed the command never read
		<-fed
	}
	return l, nil
}

// spareRequest is what the spare is told: the command's argv, its environment as a cold bwrap
// sets it (the request's, with PWD the folder it enters), its folder and whether it has input.
func (s *bubblewrapSandbox) spareRequest(sp *spareBwrap, req ExecRequest, chdir string, argv []string) ([]byte, error) {
	env := s.commandEnv(req)
	env["PWD"] = chdir // as bwrap sets it once in the folder, whatever the request said
	vars := make([]string, 0, len(env))
	for _, k := range slices.Sorted(maps.Keys(env)) {
		vars = append(vars, k+"="+env[k])
	}
	if !sp.shell {
		return spare.Encode(argv, vars, chdir, req.Stdin != nil), nil
	}
	return spare.Request(argv, vars, chdir, req.Stdin != nil, env["PATH"])
}

// pipes makes n pipes, their read and write ends in turn; none when one fails.
func pipes(n int) ([]*os.File, error) {
	var ends []*os.File
	for range n {
		r, w, err := os.Pipe()
		if err != nil {
			for _, f := range ends {
				f.Close()
			}
			return nil, err
		}
		ends = append(ends, r, w)
	}
	return ends, nil
}
