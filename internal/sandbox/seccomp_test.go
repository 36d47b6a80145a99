//go:build integration

package sandbox_test

import (
	"bytes"
	"fmt"
	"runtime"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/boxcar-run/boxcar/internal/config"
	"github.com/boxcar-run/boxcar/internal/sandbox/sandboxtest"
)

// TestEscapeSeccomp is issue 11 items 4 and 7 and the rest of the filter, each attack tried
// in a sandbox: the call must fail, and what is judged from the host (the worker's session
// keyring) must be untouched. A plain fork and a thread still work.
func TestEscapeSeccomp(t *testing.T) {
	t.Parallel()
	// Keyrings belong to a thread's credentials: the key, the snapshots and every bwrap this
	// test starts (forked from the calling thread) stay on one thread, as a worker whose whole
	// process inherited a session keyring would be.
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	// A key in this thread's session keyring, which bwrap's --new-session does not replace.
	secret := "boxcar-secret-" + fmt.Sprint(unix.Getpid())
	key, err := unix.AddKey("user", secret, []byte("do not read"), unix.KEY_SPEC_SESSION_KEYRING)
	if err != nil {
		t.Fatalf("add a key to the worker's session keyring: %v", err)
	}
	t.Cleanup(func() { _, _ = unix.KeyctlInt(unix.KEYCTL_UNLINK, key, unix.KEY_SPEC_SESSION_KEYRING, 0, 0) })
	before := sessionKeys(t)

	sb := sandboxtest.StartSpec(t, sandboxtest.Bubblewrap(t), config.SandboxSpec{})
	py := func(code string) string {
		t.Helper()
		res := run(t, sb, "python3", "-c", "import ctypes, os, sys\nlibc = ctypes.CDLL(None, use_errno=True)\n"+code)
		return strings.TrimSpace(string(res.Stdout)) + strings.TrimSpace(string(res.Stderr))
	}
	// syscall numbers are amd64's, as the filter is.
	tests := []struct {
		name, code, want string
	}{
		{"keyctl read of the worker's key", fmt.Sprintf("r = libc.syscall(250, 11, %d, None, 0); print(r, ctypes.get_errno())", key), "-1 1"},
		{"add_key to the session keyring", `r = libc.syscall(248, b"user", b"planted", b"x", 1, -3); print(r, ctypes.get_errno())`, "-1 1"},
		{"request_key", `r = libc.syscall(249, b"user", b"` + secret + `", None, -3); print(r, ctypes.get_errno())`, "-1 1"},
		{"inotify on /usr", `r = libc.inotify_init1(0); print(r, ctypes.get_errno())`, "-1 1"},
		{"fanotify", `r = libc.syscall(300, 0, 0); print(r, ctypes.get_errno())`, "-1 1"},
		{"io_uring_setup", `r = libc.syscall(425, 1, ctypes.create_string_buffer(120)); print(r, ctypes.get_errno())`, "-1 1"},
		{"ptrace", `r = libc.ptrace(16, 1, None, None); print(r, ctypes.get_errno())`, "-1 1"},
		{"perf_event_open", `r = libc.syscall(298, ctypes.create_string_buffer(128), 0, -1, -1, 0); print(r, ctypes.get_errno())`, "-1 1"},
		{"bpf", `r = libc.syscall(321, 0, ctypes.create_string_buffer(128), 128); print(r, ctypes.get_errno())`, "-1 1"},
		{"mount", `r = libc.mount(b"none", b"/tmp", b"tmpfs", 0, None); print(r, ctypes.get_errno())`, "-1 1"},
		{"unshare a user namespace", `r = libc.unshare(0x10000000); print(r, ctypes.get_errno())`, "-1 1"},
		{"clone with CLONE_NEWNET", `r = libc.syscall(56, 0x40000000 | 17, None, None, None, None); print(r, ctypes.get_errno())`, "-1 1"},
		{"personality READ_IMPLIES_EXEC", `r = libc.personality(0x0400000); print(r, ctypes.get_errno())`, "-1 1"},
		{"clone3 falls back", `r = libc.syscall(435, None, 0); print(r, ctypes.get_errno())`, "-1 38"},
		{"plain fork still works", `pid = os.fork()
if pid == 0: os._exit(7)
print(os.waitpid(pid, 0)[1] >> 8)`, "7"},
		{"threads still work", `import threading; t = threading.Thread(target=lambda: None); t.start(); t.join(); print("ok")`, "ok"},
	}
	for _, tt := range tests { // not subtests: they would run on other threads
		if got := py(tt.code); got != tt.want {
			t.Errorf("%s: got %q, want %q", tt.name, got, tt.want)
		}
	}
	if res := run(t, sb, "cat", "/proc/keys"); bytes.Contains(res.Stdout, []byte(secret)) {
		t.Errorf("/proc/keys in the sandbox lists the worker's key %s:\n%s", secret, res.Stdout)
	}
	if after := sessionKeys(t); after != before {
		t.Errorf("the worker's session keyring changed while the sandbox ran: %q, was %q", after, before)
	}
	if info := sb.Info(); info.Seccomp == "" || !strings.HasPrefix(info.SeccompDigest, "sha256:") || !strings.Contains(info.Isolation, info.SeccompDigest) {
		t.Errorf("Info names the filter %q digest %q, isolation %q; want both, and the digest in isolation", info.Seccomp, info.SeccompDigest, info.Isolation)
	}
}

// sessionKeys lists the serials in the session keyring of the worker (this process).
func sessionKeys(t *testing.T) string {
	t.Helper()
	buf := make([]byte, 4096)
	n, err := unix.KeyctlBuffer(unix.KEYCTL_READ, unix.KEY_SPEC_SESSION_KEYRING, buf, 0)
	if err != nil {
		t.Fatalf("read the worker's session keyring: %v", err)
	}
	return fmt.Sprintf("%x", buf[:min(n, len(buf))])
}
