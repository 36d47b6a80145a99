//go:build integration

package sandbox

import (
	"bytes"
	"os/exec"
	"syscall"
)

// BareBwrap is the bwrap command a bubblewrap sandbox's Exec runs for argv, made bare: the
// sandbox's own options (namespaces, mounts, /etc files, environment, and whatever the
// provider adds later), passed on the command line, with the descriptors they name and the
// sandbox's host uid, but without the rlimits, the cgroup, the options pipe or any bookkeeping.
// The workdir is bound from hostDir instead of the sandbox's folder; /tmp and /dev/shm are the
// sandbox's own. It is the baseline of
// BenchmarkBubblewrapLifecycle, read from the provider so the two keep the same flags. done
// closes the descriptors once the command has started.
func BareBwrap(sb Sandbox, hostDir string, argv []string) (cmd *exec.Cmd, done func(), err error) {
	s := sb.(*bubblewrapSandbox)
	inv, err := s.prepare()
	if err != nil {
		return nil, nil, err
	}
	inv.argsWrite.Close() // bwrap reads no --args here: its options are on the command line
	var args []string
	for _, a := range bytes.Split(bytes.TrimSuffix(s.options(ExecRequest{Argv: argv}, s.workdir, false, false), []byte{0}), []byte{0}) {
		if string(a) == s.hostDir { // the workdir's bind alone: the scratch folders beside it are the sandbox's
			a = []byte(hostDir)
		}
		args = append(args, string(a))
	}
	cmd = exec.Command(s.p.bwrap, append(append(args, "--"), argv...)...)
	cmd.Env = []string{}
	cmd.Dir = "/"
	cmd.ExtraFiles = inv.child // the same descriptor numbers the options name
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Credential: s.cred}
	return cmd, inv.closeChildEnds, nil
}

// AwaitWarm warms a pool sandbox as its pool does and waits until it is as ready as it gets
// before its claim (its first command's bwrap started ahead, where it has one).
func AwaitWarm(sb Sandbox) {
	if w, ok := sb.(Warmer); ok {
		<-w.Warm()
	}
}

// HasSpare reports whether the sandbox holds a spare bwrap (ready, starting or dead), not yet
// taken by a command.
func HasSpare(sb Sandbox) bool {
	s := sb.(*bubblewrapSandbox)
	s.spareMu.Lock()
	defer s.spareMu.Unlock()
	return s.spare != nil
}

// RanOnSpare reports whether a command of the sandbox ran on its spare bwrap.
func RanOnSpare(sb Sandbox) bool {
	s := sb.(*bubblewrapSandbox)
	s.spareMu.Lock()
	defer s.spareMu.Unlock()
	return s.spareHit
}

// SpareKind says what the sandbox's spare bwrap runs, before a command takes it: "shell"
// (spare.Script), "go" (the worker's binary) or "" (none).
func SpareKind(sb Sandbox) string {
	s := sb.(*bubblewrapSandbox)
	s.spareMu.Lock()
	defer s.spareMu.Unlock()
	switch {
	case s.spare == nil:
		return ""
	case s.spare.shell:
		return "shell"
	}
	return "go"
}

// SparePid is the pid of the sandbox's spare bwrap, ready or starting; 0 when it has none.
func SparePid(sb Sandbox) int {
	s := sb.(*bubblewrapSandbox)
	s.spareMu.Lock()
	defer s.spareMu.Unlock()
	if s.spare == nil || s.spare.cmd.Process == nil {
		return 0
	}
	return s.spare.cmd.Process.Pid
}
