//go:build integration

package sandbox_test

import (
	"strconv"
	"strings"
	"testing"

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
