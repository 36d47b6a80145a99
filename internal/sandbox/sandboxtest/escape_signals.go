package sandboxtest

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/boxcar-run/boxcar/internal/sandbox"
)

// signalsFill queues real-time signals to itself (blocked, so they stay pending; at most 512)
// and then makes POSIX timers until the kernel refuses: each pending signal is a sigqueue and
// each timer a k_itimer with one, kernel memory that RLIMIT_AS does not count, and both count
// against RLIMIT_SIGPENDING. It writes what it holds to the file "held" and holds it until the
// file "release" appears.
const signalsFill = `
import ctypes, os, signal, time
libc = ctypes.CDLL(None, use_errno=True)
class Val(ctypes.Union):
    _fields_ = [("i", ctypes.c_int), ("p", ctypes.c_void_p)]
signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGRTMIN])
queued = 0
while queued < 512 and libc.sigqueue(os.getpid(), signal.SIGRTMIN, Val(0)) == 0:
    queued += 1
tid = ctypes.c_void_p()
timers = 0
while timers < 200000 and libc.timer_create(1, None, ctypes.byref(tid)) == 0:
    timers += 1
with open("held.tmp", "w") as f:
    f.write("%d %d %s\n" % (queued, timers, os.strerror(ctypes.get_errno())))
os.rename("held.tmp", "held")
while not os.path.exists("release"):
    time.sleep(0.01)
`

// testSignalsQueued fills the sandbox's pending signals and POSIX timers (signalsFill): the
// host sees its processes hold at most host.SignalsQueued of them (the SigQ of
// /proc/PID/status), and while they do, another sandbox and the worker still make timers.
func testSignalsQueued(t *testing.T, p sandbox.Provider, host Host) {
	if host.SignalsQueued == 0 {
		t.Skip("this backend's pending signals and timers are bounded by the container runtime's RLIMIT_SIGPENDING (docs/sandbox.md)")
	}
	sb, other := startEscape(t, p), startEscape(t, p)
	if err := sb.WriteFile(t.Context(), "fill.py", []byte(signalsFill)); err != nil {
		t.Fatal(err)
	}
	mark := marker()
	s := sample(func() []int64 {
		var most int64
		for pid := range hostProcs(mark) {
			most = max(most, queuedSignals(pid))
		}
		return []int64{most}
	})
	done := make(chan error, 1)
	go func() {
		_, err := attack(t, sb, mark, "exec python3 fill.py", 60*time.Second, 4096)
		done <- err
	}()
	held, err := waitForFile(t.Context(), sb, "held", done)
	if err != nil {
		t.Fatalf("the attack did not say what it holds: %v", err)
	}
	t.Logf("the attack holds (pending signals, timers, then): %s", held)
	var queued, timers int
	if _, err := fmt.Sscan(held, &queued, &timers); err != nil {
		t.Fatalf("the attack wrote %q", held)
	}
	if queued+timers > host.SignalsQueued {
		t.Errorf("a command held %d pending signals and %d timers, over the sandbox's bound of %d together", queued, timers, host.SignalsQueued)
	}
	expectOthersMakeTimers(t, other)
	if err := sb.WriteFile(t.Context(), "release", nil); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Errorf("the attack: %v", err)
	}
	peak := s.end()[0]
	t.Logf("peak on the host: %d signals queued by the attack's processes (bound %d)", peak, host.SignalsQueued)
	if peak > int64(host.SignalsQueued) {
		t.Errorf("the attack's processes held %d queued signals and timers, over the bound of %d", peak, host.SignalsQueued)
	}
}

// expectOthersMakeTimers checks that another sandbox and the worker itself still make timers.
func expectOthersMakeTimers(t *testing.T, other sandbox.Sandbox) {
	t.Helper()
	res, err := other.Exec(t.Context(), sandbox.ExecRequest{Argv: []string{"python3", "-c", `
import ctypes
libc = ctypes.CDLL(None, use_errno=True)
tid = ctypes.c_void_p()
print(sum(1 for _ in range(100) if libc.timer_create(1, None, ctypes.byref(tid)) == 0))
`}, Timeout: time.Minute})
	if got := strings.TrimSpace(string(res.Stdout)); err != nil || got != "100" {
		t.Errorf("another sandbox made %q of 100 timers (exit %d, %v, %s)", got, res.ExitCode, err, res.Stderr)
	}
	var id int32
	if _, _, e := unix.Syscall(unix.SYS_TIMER_CREATE, uintptr(unix.CLOCK_MONOTONIC), 0, uintptr(unsafe.Pointer(&id))); e != 0 {
		t.Errorf("the worker cannot make a timer: %v", e)
		return
	}
	_, _, _ = unix.Syscall(unix.SYS_TIMER_DELETE, uintptr(id), 0, 0)
}

// waitForFile waits until the sandbox holds name and returns its text, or the attack ends.
func waitForFile(ctx context.Context, sb sandbox.Sandbox, name string, done <-chan error) (string, error) {
	for {
		b, err := sb.ReadFile(ctx, name, 1024)
		if err == nil {
			return strings.TrimSpace(string(b)), nil
		}
		if !errors.Is(err, sandbox.ErrNotFound) {
			return "", err
		}
		select {
		case err := <-done:
			return "", fmt.Errorf("it ended first: %v", err)
		case <-ctx.Done():
			return "", ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// queuedSignals reads the signals queued for pid's user (the SigQ line of its status), which
// its timers count in.
func queuedSignals(pid int) int64 {
	status, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "status"))
	if err != nil {
		return 0
	}
	for line := range strings.SplitSeq(string(status), "\n") {
		if v, ok := strings.CutPrefix(line, "SigQ:"); ok {
			n, _, _ := strings.Cut(strings.TrimSpace(v), "/")
			q, _ := strconv.ParseInt(n, 10, 64)
			return q
		}
	}
	return 0
}
