package sandbox

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"runtime"

	seccomp "github.com/elastic/go-seccomp-bpf"
	"golang.org/x/net/bpf"
	"golang.org/x/sys/unix"
)

// seccompName names the filter bubblewrap sandboxes run under; change it with the policy.
const seccompName = "boxcar-default-v1"

// seccompPolicy follows the container runtimes' default profile where it matters to a job
// sandbox, as a deny list (everything else is allowed, as bwrap's own namespaces and rlimits
// bound it): no kernel keyrings (so no key of the worker's session keyring is visible, and
// nothing a sandbox adds outlives it), no io_uring (which bypasses syscall filtering), no
// inotify or fanotify (which would show a sandbox what the host and other jobs execute from
// the shared read-only /usr), no ptrace or cross-process memory access, no perf_event_open,
// no bpf, no mount family, no new namespaces (unshare, setns, clone with a CLONE_NEW* flag;
// a plain fork or thread still works), no personality changes beyond the ones runtimes allow.
// The calls fail with EPERM; clone3, whose flags a filter cannot read, fails with ENOSYS so that
// the C library falls back to clone.
func seccompPolicy() seccomp.Policy {
	const newNamespaces = unix.CLONE_NEWNS | unix.CLONE_NEWUTS | unix.CLONE_NEWIPC | unix.CLONE_NEWUSER |
		unix.CLONE_NEWPID | unix.CLONE_NEWNET | unix.CLONE_NEWCGROUP
	eperm := seccomp.ActionErrno
	var personality seccomp.ArgumentConditions
	for _, allowed := range []uint64{0, 0x0008, 0x20000, 0x20008, 0xffffffff} { // as Docker's profile
		personality = append(personality, seccomp.Condition{Argument: 0, Operation: seccomp.NotEqual, Value: allowed})
	}
	return seccomp.Policy{
		DefaultAction: seccomp.ActionAllow,
		Syscalls: []seccomp.SyscallGroup{
			{Action: eperm, Names: []string{
				"keyctl", "add_key", "request_key",
				"io_uring_setup", "io_uring_enter", "io_uring_register",
				"inotify_init", "inotify_init1", "inotify_add_watch", "fanotify_init", "fanotify_mark",
				"ptrace", "process_vm_readv", "process_vm_writev", "kcmp",
				"perf_event_open", "bpf", "userfaultfd",
				"mount", "umount2", "pivot_root", "move_mount", "open_tree", "fsopen", "fsconfig",
				"fsmount", "fspick", "mount_setattr",
				"unshare", "setns",
				"kexec_load", "kexec_file_load", "init_module", "finit_module", "delete_module",
				"reboot", "swapon", "swapoff", "acct", "syslog", "quotactl",
			}},
			{Action: eperm, NamesWithCondtions: []seccomp.NameWithConditions{
				{Name: "clone", Conditions: seccomp.ArgumentConditions{{Argument: 0, Operation: seccomp.BitsSet, Value: newNamespaces}}},
				{Name: "personality", Conditions: personality},
			}},
			{Action: seccomp.ActionErrno | seccomp.Action(unix.ENOSYS), Names: []string{"clone3"}},
		},
	}
}

// seccompFilter is the filter assembled for this machine, as struct sock_filter records (what
// bwrap --seccomp reads), and its digest.
type seccompFilter struct {
	program []byte
	digest  string // sha256:<hex> of program
}

func buildSeccomp() (*seccompFilter, error) {
	if runtime.GOARCH != "amd64" {
		return nil, fmt.Errorf("the seccomp filter is built for amd64 only, not %s", runtime.GOARCH)
	}
	policy := seccompPolicy()
	insns, err := policy.Assemble()
	if err != nil {
		return nil, fmt.Errorf("assemble the seccomp filter: %w", err)
	}
	// The library lets a foreign architecture through to the default action. Refuse every
	// other ABI instead (i386 through int 0x80 would otherwise bypass the list).
	insns = append([]bpf.Instruction{
		bpf.LoadAbsolute{Off: 4, Size: 4}, // seccomp_data.arch
		bpf.JumpIf{Cond: bpf.JumpEqual, Val: unix.AUDIT_ARCH_X86_64, SkipTrue: 1},
		bpf.RetConstant{Val: unix.SECCOMP_RET_ERRNO | uint32(unix.ENOSYS)},
	}, insns...)
	raw, err := bpf.Assemble(insns)
	if err != nil {
		return nil, fmt.Errorf("assemble the seccomp filter: %w", err)
	}
	prog := make([]byte, 0, 8*len(raw))
	for _, r := range raw {
		prog = binary.LittleEndian.AppendUint16(prog, r.Op)
		prog = append(prog, r.Jt, r.Jf)
		prog = binary.LittleEndian.AppendUint32(prog, r.K)
	}
	sum := sha256.Sum256(prog)
	return &seccompFilter{program: prog, digest: "sha256:" + hex.EncodeToString(sum[:])}, nil
}
