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

// The filters bubblewrap sandboxes run under, by name; change a name with its policy.
const (
	seccompDefault = "boxcar-default-v1"
	// seccompNoSysVIPC is the default filter less System V IPC, for sandboxes no memory cgroup
	// bounds (sysvIPCCalls).
	seccompNoSysVIPC = "boxcar-nosysvipc-v1"
)

// sysvIPCCalls are System V IPC. What they make (a shared memory segment, once detached; a
// message queued; a semaphore set) lives in the sandbox's IPC namespace until the last process
// of the Exec has ended, whoever made it, and is memory RLIMIT_AS does not count. The kernel's
// defaults allow far more than any sandbox's memory: shmall is unlimited, message queues hold
// msgmni (32000) x msgmnb (16 KiB) of text, semaphores (some 40 bytes each) number semmns
// (1 024 000 000); shm_rmid_forced, which would end a segment at its detach, is a sysctl of the
// IPC namespace that neither bwrap nor the sandbox can set. A memory cgroup counts all of it, so
// the calls are refused only where none is in force, with ENOSYS as from a kernel built without
// System V IPC: programs that can do without it fall back to POSIX shared memory and
// semaphores, which live in /dev/shm, a tmpfs the disk bound sizes.
var sysvIPCCalls = []string{
	"shmget", "shmat", "shmdt", "shmctl",
	"msgget", "msgsnd", "msgrcv", "msgctl",
	"semget", "semop", "semtimedop", "semctl",
}

// seccompPolicy follows the container runtimes' default profile where it matters to a job
// sandbox, as a deny list (everything else is allowed, as bwrap's own namespaces and rlimits
// bound it): no kernel keyrings (so no key of the worker's session keyring is visible, and
// nothing a sandbox adds outlives it), no io_uring (which bypasses syscall filtering), no
// inotify or fanotify (which would show a sandbox what the host and other jobs execute from
// the shared read-only /usr), no ptrace or cross-process memory access, no perf_event_open,
// no bpf, no mount family, no new namespaces (unshare, setns, clone with a CLONE_NEW* flag;
// a plain fork or thread still works), no personality changes beyond the ones runtimes allow.
// The calls fail with EPERM; clone3, whose flags a filter cannot read, fails with ENOSYS so that
// the C library falls back to clone. Without sysvIPC, System V IPC fails with ENOSYS too.
func seccompPolicy(sysvIPC bool) seccomp.Policy {
	const newNamespaces = unix.CLONE_NEWNS | unix.CLONE_NEWUTS | unix.CLONE_NEWIPC | unix.CLONE_NEWUSER |
		unix.CLONE_NEWPID | unix.CLONE_NEWNET | unix.CLONE_NEWCGROUP
	eperm, enosys := seccomp.ActionErrno, seccomp.ActionErrno|seccomp.Action(unix.ENOSYS)
	var personality seccomp.ArgumentConditions
	for _, allowed := range []uint64{0, 0x0008, 0x20000, 0x20008, 0xffffffff} { // as Docker's profile
		personality = append(personality, seccomp.Condition{Argument: 0, Operation: seccomp.NotEqual, Value: allowed})
	}
	policy := seccomp.Policy{
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
			{Action: enosys, Names: []string{"clone3"}},
		},
	}
	if !sysvIPC {
		policy.Syscalls = append(policy.Syscalls, seccomp.SyscallGroup{Action: enosys, Names: sysvIPCCalls})
	}
	return policy
}

// seccompFilter is a filter assembled for this machine, as struct sock_filter records (what
// bwrap --seccomp reads), its name and its digest.
type seccompFilter struct {
	name    string
	program []byte
	digest  string // sha256:<hex> of program
}

// seccompFilters are the filters a provider gives its sandboxes, each chosen by whether a memory
// cgroup bounds the sandbox. Both are nil when sandboxes run without one (noSeccomp).
type seccompFilters struct {
	withSysVIPC, withoutSysVIPC *seccompFilter
}

func buildSeccompFilters() (seccompFilters, error) {
	with, err := buildSeccomp(seccompDefault, seccompPolicy(true))
	if err != nil {
		return seccompFilters{}, err
	}
	without, err := buildSeccomp(seccompNoSysVIPC, seccompPolicy(false))
	if err != nil {
		return seccompFilters{}, err
	}
	return seccompFilters{withSysVIPC: with, withoutSysVIPC: without}, nil
}

// choose is the filter of a sandbox: System V IPC only where a memory cgroup counts it.
func (f seccompFilters) choose(memoryCgroup bool) *seccompFilter {
	if memoryCgroup {
		return f.withSysVIPC
	}
	return f.withoutSysVIPC
}

func buildSeccomp(name string, policy seccomp.Policy) (*seccompFilter, error) {
	if runtime.GOARCH != "amd64" {
		return nil, fmt.Errorf("the seccomp filter is built for amd64 only, not %s", runtime.GOARCH)
	}
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
	return &seccompFilter{name: name, program: prog, digest: "sha256:" + hex.EncodeToString(sum[:])}, nil
}
