package tunnel

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"sync"
	"syscall"

	"golang.org/x/sys/unix"
)

// killRounds bounds kill's rounds: each stops and kills all it found, so only processes forked
// while a round read /proc survive it, and a round finds fewer of those each time.
const killRounds = 50

// commandSet is what the session's process runs: the root of each command it started (the
// process exec.Cmd made), and that command's mark. A command's tree is found by two things
// its processes cannot shed: parentage (a process cannot change its parent, only lose it when
// the parent dies) and, in a session that is a child subreaper (reaper), that what a command
// orphans comes to the session rather than to the pod's pid 1. The mark alone is not enough:
// a process can start a child without it (env -i, env -u).
type commandSet struct {
	// mu is held while a command starts and through each round of a kill, so that a root
	// forked but not yet registered is never taken for an orphan, nor reaped.
	mu     sync.Mutex
	roots  map[int]string // pid -> mark ("" for a command without one)
	reaper bool
	self   int
}

func newCommandSet(reaper bool) *commandSet {
	return &commandSet{roots: map[int]string{}, reaper: reaper, self: os.Getpid()}
}

// becomeReaper makes this process a child subreaper: a process its descendants orphan (a
// double fork, a parent killed first) becomes its child instead of the pod's pid 1's, so that
// kill finds it by parentage.
func becomeReaper() error {
	if err := unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0); err != nil {
		return fmt.Errorf("become a child subreaper: %w", err)
	}
	return nil
}

// start starts cmd and registers it as a command's root, under the lock a kill's round holds.
func (s *commandSet) start(cmd *exec.Cmd, mark string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := cmd.Start(); err != nil {
		return err
	}
	s.roots[cmd.Process.Pid] = mark
	return nil
}

// done forgets a root once exec.Cmd has waited for it: its pid may be reused from then on.
func (s *commandSet) done(root int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.roots, root)
}

// kill kills a command's tree until none of it is left: the processes whose environment holds
// mark (NAME=VALUE; "" for none), the descendants of root (0 once it has been waited for), and
// in a reaping session every process orphaned to it that no live command owns: it is not a
// live command's root nor beneath one, and carries no live command's mark. Another live
// command's processes are never touched, nor pid 1 or the session itself.
//
// It runs in the pod's side and starts no process: it reads /proc and sends signals, which
// need no free slot in the pod's process bound. The processes found are all stopped, then all
// killed: killed one by one, the rest of a fork bomb would keep forking in the gaps. Orphans
// that have exited are reaped, by their own pid (wait4(-1) would take the exit status exec.Cmd
// waits for), so that their zombies do not fill the process bound.
func (s *commandSet) kill(mark string, root int) {
	for range killRounds {
		if !s.killRound(mark, root) {
			return
		}
	}
}

// killRound is one round of kill; false when it found nothing left to kill.
func (s *commandSet) killRound(mark string, root int) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, live := s.roots[root]; !live {
		root = 0
	}
	procs := readProcs()
	var pids []int
	for pid, p := range procs {
		switch s.judge(procs, pid, mark, root) {
		case killIt:
			if !p.zombie {
				pids = append(pids, pid)
			}
		case reapIt:
			s.reap(pid)
		}
	}
	if len(pids) == 0 {
		return false
	}
	for _, pid := range pids {
		_ = syscall.Kill(pid, syscall.SIGSTOP)
	}
	for _, pid := range pids {
		_ = syscall.Kill(pid, syscall.SIGKILL)
	}
	return true
}

type verdict int

const (
	spare  verdict = iota
	killIt         // part of the command's tree
	reapIt         // an unowned orphan that has exited
)

// judge says what becomes of pid in a kill of mark's command rooted at root.
func (s *commandSet) judge(procs map[int]proc, pid int, mark string, root int) verdict {
	p := procs[pid]
	if pid == s.self || pid == 1 {
		return spare
	}
	if mark != "" && p.carries(mark) {
		return killIt
	}
	top, ok := topBelow(procs, pid, s.self)
	switch {
	case !ok:
		return spare // not the session's: pid 1's, or another exec's
	case root != 0 && top == root:
		return killIt // the root, or beneath it
	case !s.reaper:
		// The session's process is not a subreaper (a test's, in-process): its other
		// children are not orphans.
		return spare
	}
	if _, isRoot := s.roots[top]; isRoot {
		return spare // beneath a live command's root: that command's
	}
	if s.carriesLive(p) {
		return spare
	}
	if p.zombie {
		if p.ppid == s.self {
			return reapIt
		}
		return spare // its parent reaps it, or it comes to the session when that parent dies
	}
	return killIt
}

// carriesLive reports whether p carries the mark of a command the session runs.
func (s *commandSet) carriesLive(p proc) bool {
	for _, m := range s.roots {
		if m != "" && p.carries(m) {
			return true
		}
	}
	return false
}

// reap collects an orphan that has exited, by its pid only.
func (s *commandSet) reap(pid int) {
	var ws syscall.WaitStatus
	_, _ = syscall.Wait4(pid, &ws, syscall.WNOHANG, nil)
}

// topBelow follows pid's parents up to the session (self) and returns the ancestor just below
// it (pid itself for a child of the session); false when the parents end elsewhere (0, pid 1,
// a process already gone).
func topBelow(procs map[int]proc, pid, self int) (int, bool) {
	for range len(procs) + 1 { // parents cannot loop; this only bounds a /proc read mid-change
		p, ok := procs[pid]
		if !ok {
			return 0, false
		}
		if p.ppid == self {
			return pid, true
		}
		pid = p.ppid
	}
	return 0, false
}

// proc is what kill reads of one process.
type proc struct {
	ppid   int
	zombie bool
	env    []byte // NUL-separated; empty for a zombie, which has none left to read
}

func (p proc) carries(mark string) bool {
	for entry := range bytes.SplitSeq(p.env, []byte{0}) {
		if string(entry) == mark {
			return true
		}
	}
	return false
}

// readProcs reads every process's parent, state and environment. A process whose stat cannot
// be read has gone and is left out.
func readProcs() map[int]proc {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return nil
	}
	procs := make(map[int]proc, len(entries))
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		p, err := readProc(e.Name())
		if err != nil {
			continue
		}
		procs[pid] = p
	}
	return procs
}

// readProc reads /proc/PID/stat's state and parent: "pid (comm) state ppid ...", where comm
// may hold spaces and parentheses, so the fields are read after the last ')'.
func readProc(pid string) (proc, error) {
	stat, err := os.ReadFile("/proc/" + pid + "/stat")
	if err != nil {
		return proc{}, err
	}
	i := bytes.LastIndexByte(stat, ')')
	if i < 0 {
		return proc{}, fmt.Errorf("/proc/%s/stat: no comm", pid)
	}
	fields := bytes.Fields(stat[i+1:])
	if len(fields) < 2 {
		return proc{}, fmt.Errorf("/proc/%s/stat: %d fields after comm", pid, len(fields))
	}
	ppid, err := strconv.Atoi(string(fields[1]))
	if err != nil {
		return proc{}, fmt.Errorf("/proc/%s/stat: parent: %w", pid, err)
	}
	env, _ := os.ReadFile("/proc/" + pid + "/environ")
	return proc{ppid: ppid, zombie: string(fields[0]) == "Z", env: env}, nil
}
