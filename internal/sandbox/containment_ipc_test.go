//go:build integration

package sandbox_test

import (
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/boxcar-run/boxcar/internal/config"
	"github.com/boxcar-run/boxcar/internal/sandbox"
	"github.com/boxcar-run/boxcar/internal/sandbox/sandboxtest"
)

// mqFill opens POSIX message queues of 10 messages of 8 KiB (the defaults of a new IPC
// namespace's fs.mqueue) and fills them until the kernel refuses, then prints how many
// messages it holds.
const mqFill = `
import ctypes, os
rt = ctypes.CDLL("librt.so.1", use_errno=True)
class Attr(ctypes.Structure):
    _fields_ = [("flags", ctypes.c_long), ("maxmsg", ctypes.c_long), ("msgsize", ctypes.c_long), ("curmsgs", ctypes.c_long), ("pad", ctypes.c_long * 4)]
rt.mq_open.restype = ctypes.c_int
rt.mq_open.argtypes = [ctypes.c_char_p, ctypes.c_int, ctypes.c_int, ctypes.POINTER(Attr)]
rt.mq_send.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_size_t, ctypes.c_uint]
msg = b"x" * 8192
held, why = 0, ""
for i in range(100000):
    a = Attr(0, 10, 8192, 0)
    q = rt.mq_open(("/boxcar-%d" % i).encode(), os.O_CREAT | os.O_RDWR | os.O_NONBLOCK, 0o600, ctypes.byref(a))
    if q < 0:
        why = os.strerror(ctypes.get_errno())
        break
    for _ in range(10):
        if rt.mq_send(q, msg, len(msg), 0) == 0:
            held += 1
print(held, why)
`

// TestContainmentMessageQueuesBounded: POSIX message queues are kernel memory that RLIMIT_AS
// does not count, bounded per host uid by RLIMIT_MSGQUEUE. A sandbox inherited the worker's,
// whatever it was (here the kernel's default of 800 KiB, which a unit's LimitMSGQUEUE or a
// container's ulimit may raise to unlimited: then each command's IPC namespace took 256 queues,
// its queues_max, of 80 KiB each). The sandbox has a bound of its own, below the default.
func TestContainmentMessageQueuesBounded(t *testing.T) {
	t.Parallel()
	for _, mode := range boundModes {
		t.Run(mode.name, func(t *testing.T) {
			t.Parallel()
			sb := sandboxtest.StartSpec(t, sandboxtest.Bubblewrap(t, mode.edit), config.SandboxSpec{})
			out := strings.Fields(py(t, sb, mqFill))
			held, err := strconv.ParseInt(out[0], 10, 64)
			if err != nil {
				t.Fatalf("mqFill printed %q", out)
			}
			t.Logf("held %d messages of 8 KiB, then: %s", held, strings.Join(out[1:], " "))
			if held*8192 > sandbox.MessageQueueBytes {
				t.Errorf("a command held %d bytes in message queues, over the sandbox's bound of %d", held*8192, sandbox.MessageQueueBytes)
			}
		})
	}
}

// TestContainmentScratchInodesBounded: a command makes empty files in /tmp until refused (up to
// 400 000). Empty files use no pages, so a tmpfs's size= does not stop them, and each inode is
// kernel memory that RLIMIT_AS does not count. Where the worker mounts /tmp, its nr_inodes
// refuses them past the disk bound's inodes; where bwrap makes it (no nr_inodes: the kernel's
// default of half the host's pages), rlimits only, the command made all 400 000. Now the worker
// kills it past that bound (ErrDiskFull).
func TestContainmentScratchInodesBounded(t *testing.T) {
	t.Parallel()
	for _, disk := range diskModes {
		for _, mode := range boundModes {
			t.Run(disk.name+", "+mode.name, func(t *testing.T) {
				t.Parallel()
				scratchInodesBounded(t, sandboxtest.Bubblewrap(t, disk.edit, mode.edit), mode.name == "cgroups")
			})
		}
	}
}

// TestContainmentScratchInodesBoundedNonRootWorker: the same for a worker that is not root.
// It mounts nothing, so bwrap makes /tmp and the worker reads its inodes through
// /proc/<pid>/root of a process in a user namespace bwrap made as the worker's uid, which the
// kernel allows the namespace's owner; it has no cgroup and no host uid per sandbox.
func TestContainmentScratchInodesBoundedNonRootWorker(t *testing.T) {
	t.Parallel()
	if !asNonRootWorker(t) {
		return
	}
	p := sandboxtest.Bubblewrap(t, func(c *sandbox.BubblewrapConfig) { c.DiskBestEffort = true })
	scratchInodesBounded(t, p, false)
}

// scratchInodesBounded makes empty files in /tmp until refused, and wants the command refused
// at the disk bound's inodes, killed with ErrDiskFull or, where oomKills, by the memory cgroup.
func scratchInodesBounded(t *testing.T, p *sandbox.BubblewrapProvider, oomKills bool) {
	t.Helper()
	const fill = `
import os, sys
n = 0
try:
    while n < 400000:
        open("/tmp/e%d" % n, "w").close()
        n += 1
except OSError as e:
    print("refused:", e.strerror, file=sys.stderr)
print(n)
`
	spec := config.SandboxSpec{Memory: "128Mi", PIDs: 32, Disk: "16Mi"}
	inodes := int64(16 << 20 / 4096) // the disk bound's: one per 4 KiB
	sb := sandboxtest.StartSpec(t, p, spec)
	t.Logf("isolation: %s", sb.Info().Isolation)
	res, err := sb.Exec(t.Context(), sandbox.ExecRequest{Argv: []string{"python3", "-c", fill}, Timeout: 2 * time.Minute})
	t.Logf("exit %d, err %v, stdout %q, stderr %q", res.ExitCode, err, res.Stdout, lastLine(res.Stderr))
	made, perr := strconv.ParseInt(strings.TrimSpace(string(res.Stdout)), 10, 64)
	switch {
	case errors.Is(err, sandbox.ErrDiskFull):
		// Killed by the worker: what it made in the last poll's interval went past.
	case err == nil && perr == nil && made <= inodes:
		// Refused by the kernel, at nr_inodes (the root folder takes one).
	case err == nil && res.ExitCode == 137 && oomKills:
		// The memory cgroup, which counts the inodes, killed it first.
	default:
		t.Errorf("a command made %q empty files in /tmp (err %v, exit %d); want at most %d, or the command stopped with ErrDiskFull", res.Stdout, err, res.ExitCode, inodes)
	}
}
