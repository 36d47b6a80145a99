package sandbox

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"os/exec"
	"path"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/boxcar-run/boxcar/internal/sandbox/bridge"
	"github.com/boxcar-run/boxcar/internal/spawn"
)

// Causes of a command's end that the result reports.
var (
	errExecTimeout = errors.New("command timed out")
	errExecDisk    = errors.New("workdir over its disk bound")
	errExecScratch = errors.New("/tmp or /dev/shm over its inode bound")
)

// Exec runs argv in a fresh bwrap invocation over the shared workdir.
//
// The process chain is bwrap → bwrap's pid 1 → argv. bwrap reads its options from a pipe, and
// so waits before cloning anything until the worker has set its rlimits (prlimit(2) on its
// pid) and moved it into the sandbox's cgroup: the command and all it forks are bounded from
// their first instruction, with no process of the worker's left in between.
//
// When the workdir ends up over its disk bound, Exec returns the result together with an
// error wrapping ErrDiskFull. A command that could not run because the sandbox went away from
// outside fails with ErrSandboxLost (gone).
func (s *bubblewrapSandbox) Exec(ctx context.Context, req ExecRequest) (ExecResult, error) {
	res, err := s.exec(ctx, req)
	if len(req.Argv) > 0 {
		if lost := s.lost("exec "+req.Argv[0], err); lost != err { //nolint:errorlint // identity: lost returns err itself when the sandbox is there
			return ExecResult{}, lost
		}
	}
	return res, err
}

// exec is Exec.
func (s *bubblewrapSandbox) exec(ctx context.Context, req ExecRequest) (ExecResult, error) {
	dir, maxOut, err := checkExec(req)
	if err != nil {
		return ExecResult{}, err
	}
	name := req.Argv[0]

	runCtx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	id, err := s.begin(cancel)
	if err != nil {
		return ExecResult{}, fmt.Errorf("sandbox: exec %s: %w", name, err)
	}
	defer s.end(id)
	bridged := s.egressOn.Load() // read once: the descriptors, options and argv must agree
	sp := s.takeSpare(bridged)
	if req.Timeout > 0 {
		var stop context.CancelFunc
		runCtx, stop = context.WithTimeoutCause(runCtx, req.Timeout, errExecTimeout)
		defer stop()
	}
	if dir != "." {
		fd, err := s.wd.openat(int(s.wd.fd.Fd()), dir, unix.O_PATH|unix.O_DIRECTORY, 0, resolveInside)
		if err != nil {
			if sp != nil {
				sp.discard()
			}
			return ExecResult{}, pathError("exec "+name+": dir", dir, err)
		}
		unix.Close(fd)
	}

	// Over its bound already, the workdir may shrink (a command that removes files) but not
	// grow.
	diskLimit := s.disk
	if used, err := s.wd.usage(); err == nil {
		diskLimit = diskLimit.grow(used)
	}
	oomBefore, oomKnown := s.oomKills()

	argv := req.Argv
	if bridged {
		argv = bridgeArgv(argv)
	}
	l, err := s.launchOn(runCtx, cancel, sp, req, path.Join(s.workdir, dir), maxOut, argv, bridged)
	switch {
	case err != nil && errors.Is(context.Cause(runCtx), errExecTimeout):
		return s.timedOutUnstarted(name, req, err), nil
	case err != nil:
		return ExecResult{}, fmt.Errorf("sandbox: exec %s: %w", name, err)
	}
	cmd, stdout, stderr, start := l.cmd, l.stdout, l.stderr, l.start

	watchDone := make(chan struct{})
	watchStop := make(chan struct{})
	go func() {
		defer close(watchDone)
		s.watchDisk(watchStop, cancel, diskLimit, cmd.Process.Pid)
	}()
	waitErr := cmd.Wait()
	if l.after != nil {
		l.after()
	}
	close(watchStop)
	<-watchDone

	res := ExecResult{Duration: time.Since(start)}
	res.Stdout, res.StdoutTruncated = stdout.take()
	res.Stderr, res.StderrTruncated = stderr.take()
	if cmd.ProcessState == nil {
		return res, fmt.Errorf("sandbox: exec %s: %w", name, waitErr)
	}
	ws := cmd.ProcessState.Sys().(syscall.WaitStatus)
	if ws.Signaled() {
		res.ExitCode = 128 + int(ws.Signal())
	} else {
		res.ExitCode = ws.ExitStatus()
	}
	if oomAfter, ok := s.oomKills(); oomKnown && ok && oomAfter > oomBefore {
		s.noteOOM(&res, maxOut)
	}

	if l.killed.Load() {
		switch cause := context.Cause(runCtx); {
		case errors.Is(cause, errExecTimeout):
			res.TimedOut = true
		case errors.Is(cause, errExecDisk):
			return res, s.diskError(name)
		case errors.Is(cause, errExecScratch):
			return res, fmt.Errorf("sandbox: exec %s: killed: %w", name, s.scratchError())
		default:
			return res, stopError(ctx, name, cause)
		}
	} else if err := s.launcherFailure(&res, req); err != nil {
		return ExecResult{}, fmt.Errorf("sandbox: exec %s: %w", name, err)
	}
	s.log.Debug("exec", "argv0", name, "exit_code", res.ExitCode, "timed_out", res.TimedOut,
		"duration_ms", res.Duration.Milliseconds())
	if used, err := s.wd.usage(); err != nil || used.over(s.disk) {
		return res, s.diskError(name)
	}
	return res, nil
}

// launchOn starts the command on the spare bwrap sp when there is one that takes it, else on
// a bwrap of its own (launch).
func (s *bubblewrapSandbox) launchOn(runCtx context.Context, cancel context.CancelCauseFunc, sp *spareBwrap, req ExecRequest, chdir string, maxOut int, argv []string, bridged bool) (*launched, error) {
	if sp != nil {
		l, err := s.launchOnSpare(runCtx, sp, req, chdir, maxOut, argv)
		if err == nil {
			return l, nil
		}
		s.log.Debug("the spare bwrap cannot take the first command; it starts its own", "error", err)
	}
	return s.launch(runCtx, cancel, req, chdir, maxOut, argv, bridged)
}

// timedOutUnstarted is the result of a command whose timeout passed before its bwrap started
// (a timeout of a few µs): its timeout, as one that passes while it runs, not the job's.
func (s *bubblewrapSandbox) timedOutUnstarted(name string, req ExecRequest, err error) ExecResult {
	s.log.Debug("the command's timeout passed before it started", "argv0", name, "error", err)
	return ExecResult{ExitCode: 128 + int(syscall.SIGKILL), TimedOut: true, Duration: req.Timeout}
}

// launched is a command's bwrap, running: started for it, or a spare it was handed to.
type launched struct {
	cmd            *exec.Cmd
	stdout, stderr *cappedBuffer
	killed         *atomic.Bool // set when the command was killed from outside
	start          time.Time
	after          func() // run once cmd.Wait returned; nil: nothing
}

// launch starts bwrap for one command, bounded before it clones anything (Exec). An error
// means the command could not start; a kill during the set-up is reported by the caller as
// usual.
func (s *bubblewrapSandbox) launch(runCtx context.Context, cancel context.CancelCauseFunc, req ExecRequest, chdir string, maxOut int, argv []string, bridged bool) (*launched, error) {
	inv, err := s.prepare()
	if err != nil {
		return nil, err
	}
	defer inv.close()
	l := &launched{stdout: &cappedBuffer{max: maxOut}, stderr: &cappedBuffer{max: maxOut}, killed: new(atomic.Bool)}
	cmd := exec.CommandContext(runCtx, s.p.bwrap, append([]string{"--args", strconv.Itoa(fdArgs), "--"}, argv...)...)
	cmd.Env = []string{} // nothing of the worker's environment reaches even bwrap
	cmd.Dir = "/"
	cmd.Stdout, cmd.Stderr = l.stdout, l.stderr
	if req.Stdin != nil {
		cmd.Stdin = bytes.NewReader(req.Stdin)
	}
	cmd.ExtraFiles = inv.child
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Credential: s.cred}
	// bwrap's child is pid 1 of the command's pid namespace and dies with bwrap
	// (--die-with-parent); when pid 1 dies the kernel kills everything else in the namespace.
	// So killing bwrap's process group ends the whole tree, however it forked or detached.
	cmd.Cancel = func() error {
		l.killed.Store(true)
		return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
	}
	cmd.WaitDelay = waitDelay
	l.cmd = cmd

	l.start = time.Now()
	if err := spawn.Start(cmd); err != nil {
		return nil, fmt.Errorf("start %s: %w", s.p.bwrap, err)
	}
	inv.closeChildEnds()
	if err := s.release(inv, cmd.Process.Pid, s.options(req, chdir, bridged, false)); err != nil && runCtx.Err() == nil {
		// The command could not be bounded, or bwrap died early: it must not run.
		cancel(err)
		_ = cmd.Wait()
		errOut, _ := l.stderr.take()
		return nil, fmt.Errorf("could not start the sandbox: %v (%s)", err, firstLine(errOut, nil))
	}
	// Otherwise a kill (timeout, ctx, Close) interrupted the set-up: reported as usual.
	return l, nil
}

// stopError reports a command killed because the caller's ctx ended or the sandbox closed.
func stopError(ctx context.Context, name string, cause error) error {
	if err := ctx.Err(); err != nil {
		cause = err
	}
	return fmt.Errorf("sandbox: exec %s: killed: %w", name, cause)
}

func (s *bubblewrapSandbox) diskError(name string) error {
	used, err := s.wd.usage()
	if err != nil {
		return fmt.Errorf("sandbox: exec %s: cannot measure the workdir (%v), so it counts as over its disk bound; remove files: %w", name, err, ErrDiskFull)
	}
	return fmt.Errorf("sandbox: exec %s: the workdir holds %d bytes in %d files and folders, over its bound of %d bytes and %d inodes; remove files: %w",
		name, used.bytes, used.inodes, s.disk.bytes, s.disk.inodes, ErrDiskFull)
}

// launcherFailure tells bwrap's own errors apart from the command's exit status 1. A command
// that cannot be executed becomes the shell's 127 (not found) or 126 (not executable), as a
// result; any other complaint of bwrap's means the sandbox could not be set up, which is an
// error.
func (s *bubblewrapSandbox) launcherFailure(res *ExecResult, req ExecRequest) error {
	line, _, _ := bytes.Cut(res.Stderr, []byte("\n"))
	switch {
	case res.ExitCode == 0:
		return nil
	case res.ExitCode != 1 || !bytes.HasPrefix(line, []byte("bwrap: ")):
		return nil
	}
	msg := strings.TrimPrefix(string(line), "bwrap: ")
	rest, ok := strings.CutPrefix(msg, "execvp ")
	if !ok {
		return fmt.Errorf("bubblewrap could not set up the sandbox: %s", msg)
	}
	reason := rest[strings.LastIndex(rest, ": ")+2:]
	res.ExitCode = 126
	text := fmt.Sprintf("boxcar sandbox: %s: cannot execute: %s\n", req.Argv[0], reason)
	if strings.EqualFold(reason, syscall.ENOENT.Error()) {
		res.ExitCode = 127
		pathEnv := defaultPATH
		if v, ok := req.Env["PATH"]; ok {
			pathEnv = v
		}
		text = fmt.Sprintf("boxcar sandbox: %s: command not found (PATH=%s)\n", req.Argv[0], pathEnv)
	}
	res.Stderr = []byte(text)
	res.StderrTruncated = false
	return nil
}

// oomKills is how many times the kernel has killed a process of the sandbox for want of
// memory, where a memory cgroup counts it.
func (s *bubblewrapSandbox) oomKills() (int64, bool) {
	if s.cg == nil || !slices.Contains(s.cg.controllers, ctlMemory) {
		return 0, false
	}
	return s.cg.oomKills()
}

// noteOOM tells the command's reader why a process died with SIGKILL: the kernel's OOM killer
// says nothing on the command's stderr. The note stays within the output cap.
func (s *bubblewrapSandbox) noteOOM(res *ExecResult, maxOut int) {
	note := fmt.Sprintf("boxcar sandbox: the kernel killed a process of the sandbox: it ran out of memory (limit %s)\n", s.info.Memory)
	if len(note) > maxOut {
		return
	}
	if keep := maxOut - len(note); len(res.Stderr) > keep {
		res.Stderr, res.StderrTruncated = res.Stderr[:keep], true
	}
	res.Stderr = append(slices.Clip(res.Stderr), note...)
}

// watchDisk is a running command's one poll loop. It kills the command when the workdir grows
// past limit: RLIMIT_FSIZE stops any single file at the bound; this stops many files adding
// up, within one poll interval. Where bwrap makes /tmp and /dev/shm (the worker does not
// mount), it also kills it past their inode bound (scratchWatch); bwrap is the command's bwrap.
//
// It wakes every diskPollMin. The scratch mounts are read at every wake-up (one fstatfs each);
// the workdir when its measurement is due: at every wake-up on the worker's tmpfs (one
// statfs), or, where it is walked, diskPollFactor times as long as the last walk took, up to
// diskPollMax. One loop rather than one per bound: two woke 80 times a second per command.
func (s *bubblewrapSandbox) watchDisk(stop <-chan struct{}, kill context.CancelCauseFunc, limit diskBound, bwrap int) {
	var scratch *scratchWatch
	if !s.p.diskMount {
		scratch = &scratchWatch{bwrap: bwrap}
		defer scratch.close()
	}
	t := time.NewTicker(diskPollMin)
	defer t.Stop()
	wait := 1 // wake-ups until the workdir's next measurement
	for {
		select {
		case <-stop:
			return
		case <-t.C:
		}
		s.pollWakeups.Add(1)
		if scratch != nil {
			if n, ok := scratch.inodes(); ok && n > s.disk.inodes { // the workdir's bound
				kill(errExecScratch)
				return
			}
		}
		if wait--; wait > 0 {
			continue
		}
		begin := time.Now()
		used, err := s.wd.usage()
		if err != nil || used.over(limit) {
			kill(errExecDisk)
			return
		}
		wait = int(min(max(diskPollFactor*time.Since(begin), diskPollMin), diskPollMax) / diskPollMin)
	}
}

// commandEnv is the environment a command gets: the defaults, then the request's.
func (s *bubblewrapSandbox) commandEnv(req ExecRequest) map[string]string {
	env := map[string]string{"PATH": defaultPATH, "HOME": s.workdir, "LANG": "C.UTF-8"}
	maps.Copy(env, req.Env)
	return env
}

// options are this Exec's bwrap options: the sandbox's, the bridge binary when egress is
// attached, then the environment (none for a spare: its helper sets the command's) and the
// folder.
func (s *bubblewrapSandbox) options(req ExecRequest, chdir string, bridged, spare bool) []byte {
	env := s.commandEnv(req)
	if spare {
		env = nil
	}
	var b bytes.Buffer
	add := func(args ...string) {
		for _, a := range args {
			b.WriteString(a)
			b.WriteByte(0)
		}
	}
	add(s.args...)
	if bridged {
		add("--ro-bind", s.egressDir, egressMount, "--ro-bind", s.p.bridgeCopy, bridge.Path)
	}
	add("--remount-ro", "/", "--clearenv")
	for _, k := range slices.Sorted(maps.Keys(env)) {
		add("--setenv", k, env[k])
	}
	add("--chdir", chdir)
	return b.Bytes()
}

// invocation holds the descriptors of one bwrap run: child are passed to it (from fd 3 on);
// argsWrite is the worker's end of the options pipe.
type invocation struct {
	child     []*os.File
	argsWrite *os.File
}

func (s *bubblewrapSandbox) prepare() (*invocation, error) {
	argsRead, argsWrite, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	inv := &invocation{child: []*os.File{argsRead}, argsWrite: argsWrite}
	for _, f := range s.etc {
		mf, err := memfile(path.Base(f.name), f.content)
		if err != nil {
			inv.close()
			return nil, err
		}
		inv.child = append(inv.child, mf)
	}
	if s.seccomp != nil {
		mf, err := memfile("seccomp", string(s.seccomp.program))
		if err != nil {
			inv.close()
			return nil, err
		}
		inv.child = append(inv.child, mf)
	}
	return inv, nil
}

// closeChildEnds drops the worker's copies of what bwrap now holds.
func (inv *invocation) closeChildEnds() {
	for i, f := range inv.child {
		if f != nil {
			f.Close()
		}
		inv.child[i] = nil
	}
}

func (inv *invocation) close() {
	inv.closeChildEnds()
	inv.argsWrite.Close()
}

// release sets the waiting bwrap's rlimits, moves it into the sandbox's cgroup and hands it its
// options. bwrap clones nothing before it has read them all, so every process of the sandbox
// is born bounded and inside.
func (s *bubblewrapSandbox) release(inv *invocation, pid int, options []byte) error {
	if err := s.setRlimits(pid); err != nil {
		return err
	}
	if s.cg != nil {
		if err := s.cg.add(pid); err != nil {
			return err
		}
	}
	if _, err := inv.argsWrite.Write(options); err != nil {
		return fmt.Errorf("hand bwrap its options: %w", err)
	}
	if err := inv.argsWrite.Close(); err != nil {
		return fmt.Errorf("hand bwrap its options: %w", err)
	}
	return nil
}

func memfile(name, content string) (*os.File, error) {
	fd, err := unix.MemfdCreate(name, unix.MFD_CLOEXEC)
	if err != nil {
		return nil, fmt.Errorf("memfd: %w", err)
	}
	f := os.NewFile(uintptr(fd), name)
	if _, err := f.WriteString(content); err != nil {
		f.Close()
		return nil, fmt.Errorf("memfd: %w", err)
	}
	if _, err := f.Seek(0, io.SeekStart); err != nil {
		f.Close()
		return nil, fmt.Errorf("memfd: %w", err)
	}
	return f, nil
}

// setRlimits sets the sandbox's rlimits on bwrap, a process of the sandbox's host uid, with
// prlimit(2): that saves the exec of a prlimit(1) that would set them on itself and then
// execute bwrap. The kernel lets a process set another's rlimits when it holds
// CAP_SYS_RESOURCE, which a root worker in a container often lacks, or when its real uid and
// gid are the target's. So a root worker takes on the sandbox's uid and gid as its real ids
// for the call, on one locked thread of its own (Linux credentials are per thread), keeping
// uid and gid 0 as effective and saved ids and so every capability, and then takes its own
// back. The thread is visible to no process of the sandbox's uid: those all run in pid
// namespaces of their own.
func (s *bubblewrapSandbox) setRlimits(pid int) error {
	if s.cred == nil { // the worker is not root: bwrap runs as the worker's own uid
		return prlimits(pid, s.rlimits)
	}
	uid, gid := uintptr(s.cred.Uid), uintptr(s.cred.Gid)
	done := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		// Not unlocked on failure: a goroutine that ends locked takes its thread with it,
		// so no other goroutine runs with the sandbox's ids.
		ruid, rgid := uintptr(unix.Getuid()), uintptr(unix.Getgid())
		if _, _, e := unix.RawSyscall(unix.SYS_SETRESGID, gid, ^uintptr(0), ^uintptr(0)); e != 0 {
			done <- fmt.Errorf("set rlimits: take gid %d as real gid: %w", gid, e)
			return
		}
		if _, _, e := unix.RawSyscall(unix.SYS_SETRESUID, uid, ^uintptr(0), ^uintptr(0)); e != 0 {
			done <- fmt.Errorf("set rlimits: take uid %d as real uid: %w", uid, e)
			return
		}
		err := prlimits(pid, s.rlimits)
		if _, _, e := unix.RawSyscall(unix.SYS_SETRESUID, ruid, ^uintptr(0), ^uintptr(0)); e != 0 {
			done <- fmt.Errorf("set rlimits: take back real uid %d: %w", ruid, e)
			return
		}
		if _, _, e := unix.RawSyscall(unix.SYS_SETRESGID, rgid, ^uintptr(0), ^uintptr(0)); e != 0 {
			done <- fmt.Errorf("set rlimits: take back real gid %d: %w", rgid, e)
			return
		}
		runtime.UnlockOSThread()
		done <- err
	}()
	return <-done
}

func prlimits(pid int, rlimits []rlimit) error {
	for _, r := range rlimits {
		lim := unix.Rlimit{Cur: r.value, Max: r.value}
		if err := unix.Prlimit(pid, r.resource, &lim, nil); err != nil {
			return fmt.Errorf("set RLIMIT_%s of bwrap (pid %d) to %d: %w", strings.ToUpper(r.name), pid, r.value, err)
		}
	}
	return nil
}
