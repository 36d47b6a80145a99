//go:build integration

package sandbox_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/boxcar-run/boxcar/internal/config"
	"github.com/boxcar-run/boxcar/internal/sandbox"
	"github.com/boxcar-run/boxcar/internal/sandbox/sandboxtest"
	"github.com/boxcar-run/boxcar/test/harness"
)

// The containment suite: each test is one attempt to break out of a bubblewrap sandbox, or to
// harm the host from inside it. Nothing here sends traffic anywhere: the network tests listen
// on the host's loopback and read the sandbox's own view of its network.

// boundModes are the ways a host bounds sandboxes: cgroups where it can make them, rlimits
// alone where it cannot. Every resource attack must fail under both.
var boundModes = []struct {
	name string
	edit func(*sandbox.BubblewrapConfig)
}{
	{name: "cgroups", edit: func(*sandbox.BubblewrapConfig) {}},
	{name: "rlimits only", edit: withoutCgroups},
}

// hostProcessesOf lists the host's processes running as uid, as "pid:cmdline".
func hostProcessesOf(t *testing.T, uid int) []string {
	t.Helper()
	return hostProcessesWhere(t, func(pid string, _ []byte) bool {
		status, err := os.ReadFile(filepath.Join("/proc", pid, "status"))
		if err != nil {
			return false
		}
		for _, line := range strings.Split(string(status), "\n") {
			if ids, ok := strings.CutPrefix(line, "Uid:"); ok && slices.Contains(strings.Fields(ids), strconv.Itoa(uid)) {
				return true
			}
		}
		return false
	})
}

// expectHostUnharmed checks that the host still starts processes and that nothing of the
// sandbox runs on after its command ended.
func expectHostUnharmed(t *testing.T, st sandbox.HostState) {
	t.Helper()
	sandboxtest.ExpectHostForks(t)
	if st.UID < 0 {
		t.Logf("the worker is not root, so the sandbox runs as the worker's uid: its leftover processes are looked for by marker in the other tests")
		return
	}
	harness.Wait(t, "no process of the sandbox's uid after its command ended", func() (bool, error) {
		left := hostProcessesOf(t, st.UID)
		return len(left) == 0, fmt.Errorf("processes of uid %d still run: %v", st.UID, left)
	}, harness.Within(3*time.Second))
}

// TestContainmentHostLoopbackUnreachable opens listeners on the host's loopback, as the worker's
// own NATS or metrics server would, and on a host abstract unix socket, and tries to reach
// them from inside: the sandbox's loopback is its own, with nothing listening.
func TestContainmentHostLoopbackUnreachable(t *testing.T) {
	t.Parallel()
	sb := sandboxtest.StartSpec(t, sandboxtest.Bubblewrap(t), config.SandboxSpec{})
	var accepted atomic.Int32
	listen := func(network, addr string) net.Listener {
		ln, err := net.Listen(network, addr)
		if err != nil {
			return nil
		}
		t.Cleanup(func() { ln.Close() })
		go func() {
			for {
				c, err := ln.Accept()
				if err != nil {
					return
				}
				accepted.Add(1)
				c.Close()
			}
		}()
		return ln
	}
	ln4 := listen("tcp4", "127.0.0.1:0")
	if ln4 == nil {
		t.Fatal("cannot listen on 127.0.0.1")
	}
	abstract := "@boxcar-test-" + strconv.FormatInt(time.Now().UnixNano(), 36)
	if listen("unix", abstract) == nil {
		t.Fatal("cannot listen on an abstract unix socket")
	}
	targets := fmt.Sprintf("[('tcp 127.0.0.1', socket.AF_INET, ('127.0.0.1', %d)), ('abstract', socket.AF_UNIX, '\\0%s')", ln4.Addr().(*net.TCPAddr).Port, abstract[1:])
	if ln6 := listen("tcp6", "[::1]:0"); ln6 != nil {
		targets += fmt.Sprintf(", ('tcp ::1', socket.AF_INET6, ('::1', %d))", ln6.Addr().(*net.TCPAddr).Port)
	}
	targets += "]"
	out := py(t, sb, `
import socket
for name, fam, addr in `+targets+`:
    s = socket.socket(fam, socket.SOCK_STREAM)
    s.settimeout(5)
    try:
        s.connect(addr)
        print(name, "CONNECTED")
    except OSError as e:
        print(name, e.strerror)
`)
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		if !strings.HasSuffix(line, "Connection refused") {
			t.Errorf("%s (want Connection refused: the sandbox's loopback is its own)", line)
		}
	}
	if n := accepted.Load(); n != 0 {
		t.Errorf("the host's listeners accepted %d connections from the sandbox", n)
	}
}

// TestContainmentNoInterfacesNoRoutes reads the sandbox's network from inside: its own
// loopback and nothing else, and no route anywhere else.
func TestContainmentNoInterfacesNoRoutes(t *testing.T) {
	t.Parallel()
	sb := sandboxtest.StartSpec(t, sandboxtest.Bubblewrap(t), config.SandboxSpec{})
	read := func(name string) string { return string(run(t, sb, "cat", name).Stdout) }

	var ifaces []string
	for _, line := range strings.Split(read("/proc/net/dev"), "\n")[2:] {
		if name, _, ok := strings.Cut(strings.TrimSpace(line), ":"); ok {
			ifaces = append(ifaces, name)
		}
	}
	if len(ifaces) != 1 || ifaces[0] != "lo" {
		t.Errorf("interfaces inside = %v, want only lo", ifaces)
	}
	if routes := strings.Split(strings.TrimSpace(read("/proc/net/route")), "\n")[1:]; len(routes) != 0 {
		t.Errorf("IPv4 routes inside: %q, want none", routes)
	}
	for _, line := range strings.Split(strings.TrimSpace(read("/proc/net/ipv6_route")), "\n") {
		if f := strings.Fields(line); len(f) > 0 && f[len(f)-1] != "lo" {
			t.Errorf("IPv6 route inside on %s: %q, want routes on lo only", f[len(f)-1], line)
		}
	}
	for _, line := range strings.Split(strings.TrimSpace(read("/proc/net/if_inet6")), "\n") {
		if f := strings.Fields(line); len(f) > 0 && f[len(f)-1] != "lo" {
			t.Errorf("IPv6 address inside on %s", f[len(f)-1])
		}
	}

	ip := ""
	for _, p := range []string{"/usr/sbin/ip", "/sbin/ip", "/usr/bin/ip", "/bin/ip"} {
		if _, err := os.Stat(p); err == nil {
			ip = p
			break
		}
	}
	if ip == "" {
		t.Log("iproute2 is not installed; /proc/net was read instead")
		return
	}
	res := run(t, sb, "sh", "-c", ip+" -o link show; echo ---; "+ip+" -4 route show table all; "+ip+" -6 route show table all")
	links, routes, _ := strings.Cut(string(res.Stdout), "---\n")
	for _, line := range strings.Split(strings.TrimSpace(links), "\n") {
		if f := strings.Fields(line); len(f) < 2 || f[1] != "lo:" {
			t.Errorf("ip link inside: %q, want lo only", line)
		}
	}
	for _, line := range strings.Split(strings.TrimSpace(routes), "\n") {
		if line != "" && !strings.Contains(line, " dev lo ") && !strings.HasSuffix(line, " dev lo") {
			t.Errorf("ip route inside: %q, want routes on lo only", line)
		}
	}
}

// TestContainmentNoHostHome looks for the host's homes and secrets from inside.
func TestContainmentNoHostHome(t *testing.T) {
	t.Parallel()
	sb := sandboxtest.StartSpec(t, sandboxtest.Bubblewrap(t), config.SandboxSpec{})
	paths := []string{"/root", "/home", "/etc/shadow", "/etc/gshadow", "/etc/ssh", "/var", "/sys", "/run", "/mnt", "/opt", "/srv"}
	if home, err := os.UserHomeDir(); err == nil {
		paths = append(paths, home)
	}
	if wd, err := os.Getwd(); err == nil {
		paths = append(paths, wd) // the worker's own folder
	}
	for _, p := range paths {
		res, err := sb.Exec(t.Context(), sandbox.ExecRequest{Argv: []string{"ls", "-a", p}, Timeout: 30 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		if res.ExitCode == 0 {
			t.Errorf("%s is visible inside: %q", p, res.Stdout)
		}
	}
	out := py(t, sb, `import os; print(sorted(os.listdir("/etc"))); print(sorted(os.listdir("/")))`)
	want := "['alternatives', 'group', 'hosts', 'ld.so.cache', 'nsswitch.conf', 'passwd']"
	if !strings.Contains(out, want) {
		t.Errorf("want /etc to hold only the synthesised files %s, got:\n%s", want, out)
	}
	if passwd := string(run(t, sb, "cat", "/etc/passwd").Stdout); strings.Contains(passwd, "/root:") || strings.Contains(passwd, "/home/") {
		t.Errorf("/etc/passwd inside names host accounts:\n%s", passwd)
	}
}

// TestContainmentNoWorkerEnvironment puts a secret in the worker's environment and looks for
// it from inside: in the command's environment, in every /proc/*/environ it can read
// (/proc/1 among them), and at the worker's own pid.
func TestContainmentNoWorkerEnvironment(t *testing.T) {
	secret := "boxcar-secret-" + strconv.FormatInt(time.Now().UnixNano(), 36)
	t.Setenv("BOXCAR_TEST_SECRET", secret)
	sb := sandboxtest.StartSpec(t, sandboxtest.Bubblewrap(t), config.SandboxSpec{})
	script := fmt.Sprintf(`env; for f in /proc/[0-9]*/environ /proc/1/environ /proc/self/environ /proc/%d/environ; do echo "== $f"; tr '\0' '\n' < "$f"; done 2>&1`, os.Getpid())
	res := run(t, sb, "sh", "-c", script)
	if bytes.Contains(res.Stdout, []byte(secret)) || bytes.Contains(res.Stdout, []byte("BOXCAR_TEST_SECRET")) {
		t.Errorf("the worker's environment is readable inside:\n%s", res.Stdout)
	}
	if !bytes.Contains(res.Stdout, []byte("== /proc/1/environ")) {
		t.Errorf("the test did not read /proc/1/environ:\n%s", res.Stdout)
	}
	for _, want := range []string{"PATH=/usr/local/bin:/usr/bin:/bin", "HOME=/work", "LANG=C.UTF-8"} {
		if !bytes.Contains(res.Stdout, []byte(want)) {
			t.Errorf("env lacks %s:\n%s", want, res.Stdout)
		}
	}
}

// TestContainmentNoCapabilities checks the command is not root and holds no capability.
func TestContainmentNoCapabilities(t *testing.T) {
	t.Parallel()
	sb := sandboxtest.StartSpec(t, sandboxtest.Bubblewrap(t), config.SandboxSpec{})
	out := py(t, sb, `
import os
print("uid", os.getuid(), os.geteuid(), os.getgid())
for line in open("/proc/self/status"):
    if line.startswith("Cap") or line.startswith("NoNewPrivs"):
        print(line.strip().replace("\t", " "))
`)
	for _, want := range []string{"uid 1000 1000 1000", "CapInh: 0000000000000000", "CapPrm: 0000000000000000", "CapEff: 0000000000000000", "CapBnd: 0000000000000000", "CapAmb: 0000000000000000"} {
		if !strings.Contains(out, want) {
			t.Errorf("want %q, got:\n%s", want, out)
		}
	}
}

// TestContainmentHostDevicesNotOwned checks the sandbox does not own the host's device nodes
// (were it host root, even mapped, it could chmod them).
func TestContainmentHostDevicesNotOwned(t *testing.T) {
	t.Parallel()
	sb := sandboxtest.StartSpec(t, sandboxtest.Bubblewrap(t), config.SandboxSpec{})
	res := run(t, sb, "stat", "-c", "%u", "/dev/null", "/usr/bin/sh")
	if got := strings.Fields(string(res.Stdout)); len(got) != 2 || got[0] == "1000" || got[1] == "1000" {
		t.Errorf("owners of /dev/null and /usr/bin/sh inside = %q, want neither to be the sandbox user 1000", got)
	}
}

// TestContainmentOwnProcesses checks the sandbox sees its own few processes, not the host's.
func TestContainmentOwnProcesses(t *testing.T) {
	t.Parallel()
	sb := sandboxtest.StartSpec(t, sandboxtest.Bubblewrap(t), config.SandboxSpec{})
	out := py(t, sb, `
import os
pids = [p for p in os.listdir("/proc") if p.isdigit()]
print("count", len(pids))
print("init", open("/proc/1/cmdline", "rb").read().split(b"\0")[0].decode())
`)
	var count int
	var init string
	_, _ = fmt.Sscanf(out, "count %d\ninit %s", &count, &init) // a short read leaves count 0, which fails below
	if count < 1 || count > 4 {
		t.Errorf("the sandbox sees %d processes, want only its own few:\n%s", count, out)
	}
	if !strings.HasSuffix(init, "bwrap") {
		t.Errorf("/proc/1 inside is %q, want bwrap's reaper", init)
	}
}

// TestContainmentReadOnlyRoot tries to write outside the workdir, /tmp and /dev/shm.
func TestContainmentReadOnlyRoot(t *testing.T) {
	t.Parallel()
	sb := sandboxtest.StartSpec(t, sandboxtest.Bubblewrap(t), config.SandboxSpec{})
	out := py(t, sb, `
for p in ["/x", "/usr/x", "/etc/x", "/bin/x", "/etc/passwd", "/proc/sys/kernel/hostname", "/dev/x", "/dev/pts/x", "/work/ok", "/tmp/ok", "/dev/shm/ok"]:
    try:
        with open(p, "a") as f:
            f.write("x")
        print(p, "WRITABLE")
    except OSError as e:
        print(p, "refused", e.strerror)
`)
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		writable := strings.HasSuffix(line, "WRITABLE")
		shouldBe := strings.HasPrefix(line, "/work/") || strings.HasPrefix(line, "/tmp/") || strings.HasPrefix(line, "/dev/shm/")
		if writable != shouldBe {
			t.Errorf("%s (want writable only under /work, /tmp and /dev/shm)", line)
		}
	}
}

// diskModes are the ways a host bounds workdirs: a tmpfs of the worker's for each where it may
// mount, a walk of the tree where it may not (and then bwrap makes /tmp and /dev/shm).
var diskModes = []struct {
	name string
	edit func(*sandbox.BubblewrapConfig)
}{
	{name: "tmpfs workdir", edit: func(*sandbox.BubblewrapConfig) {}},
	{name: "walked workdir", edit: sandbox.WithoutDiskMount},
}

// TestContainmentEveryWritableTmpfsIsBounded reads the sandbox's own mount table: every tmpfs
// it can write to has a size no larger than the workdir's filesystem, and an inode bound where
// the worker mounts them. Without one, where no memory cgroup counts tmpfs pages, a command
// parks as much of the host's memory in it as it likes (RLIMIT_AS does not count them): bwrap's
// /dev was such a tmpfs, writable by the sandbox's user.
func TestContainmentEveryWritableTmpfsIsBounded(t *testing.T) {
	t.Parallel()
	disk := int64(16 << 20)
	ceiling := disk + max(disk/16, 1<<20)
	for _, mode := range diskModes {
		t.Run(mode.name, func(t *testing.T) {
			t.Parallel()
			sb := sandboxtest.StartSpec(t, sandboxtest.Bubblewrap(t, mode.edit), bombSpec)
			wantInodes := strings.Contains(sb.Info().Isolation, "disk=tmpfs")
			res := run(t, sb, "cat", "/proc/self/mountinfo")
			var writable []string
			for _, m := range parseMountinfo(t, string(res.Stdout)) {
				if (m.point == "/" || m.point == "/dev") && m.writable {
					t.Errorf("%s is writable (%s %s); want it read-only", m.point, m.fstype, m.super)
				}
				if !m.writable {
					continue
				}
				writable = append(writable, m.point+" "+m.fstype+" "+m.super)
				if m.fstype != "tmpfs" {
					continue
				}
				size, ok := m.option("size")
				if kib, err := strconv.ParseInt(strings.TrimSuffix(size, "k"), 10, 64); !ok || err != nil || kib<<10 > ceiling {
					t.Errorf("%s: a writable tmpfs of size %q; want one of at most %d bytes (%s)", m.point, size, ceiling, m.super)
				}
				if _, ok := m.option("nr_inodes"); wantInodes && !ok {
					t.Errorf("%s: a writable tmpfs with no nr_inodes, where the worker mounts them (%s)", m.point, m.super)
				}
			}
			t.Logf("writable mounts:\n%s", strings.Join(writable, "\n"))
		})
	}
}

// mount is one line of /proc/self/mountinfo.
type mount struct {
	point, fstype, super string
	writable             bool
}

// option is the value of a superblock option ("size" of "rw,size=16384k").
func (m mount) option(name string) (string, bool) {
	for _, o := range strings.Split(m.super, ",") {
		if v, ok := strings.CutPrefix(o, name+"="); ok {
			return v, true
		}
	}
	return "", false
}

func parseMountinfo(t *testing.T, table string) []mount {
	t.Helper()
	var mounts []mount
	for _, line := range strings.Split(strings.TrimSpace(table), "\n") {
		mine, theirs, ok := strings.Cut(line, " - ")
		f, g := strings.Fields(mine), strings.Fields(theirs)
		if !ok || len(f) < 6 || len(g) < 3 {
			t.Fatalf("mountinfo line %q", line)
		}
		mounts = append(mounts, mount{point: f[4], fstype: g[0], super: g[2], writable: strings.Split(f[5], ",")[0] == "rw"})
	}
	return mounts
}

// TestContainmentScratchBounded: a command of a sandbox with 128 MiB of memory and 16 MiB of
// disk writes 384 MiB in files of 8 MiB into /dev/shm and /dev, then stays. Where no memory
// cgroup bounds it (rlimits only), what it holds in the sandbox's tmpfs mounts, judged on the
// host (statfs through /proc/<pid>/root), stays within the disk bound's filesystem: bwrap's /dev
// had no size, and the command held all 384 MiB. With a memory cgroup, either bound may stop it.
func TestContainmentScratchBounded(t *testing.T) {
	t.Parallel()
	const write = 384 << 20
	for _, mode := range boundModes {
		t.Run(mode.name, func(t *testing.T) {
			t.Parallel()
			sb := sandboxtest.StartSpec(t, sandboxtest.Bubblewrap(t, mode.edit), bombSpec)
			mark := "scratch-" + strconv.FormatInt(time.Now().UnixNano(), 36)
			ctx, cancel := context.WithCancel(context.WithoutCancel(t.Context()))
			done := make(chan struct{})
			go func() {
				defer close(done)
				script := ": " + mark + "; for d in /dev/shm /dev; do for i in $(seq " + strconv.Itoa(write/(8<<20)) + "); do head -c 8388608 /dev/zero > $d/f$i || break; done; done; : > written; sleep 60"
				res, err := sb.Exec(ctx, sandbox.ExecRequest{Argv: []string{"sh", "-c", script}, Timeout: 90 * time.Second, MaxOutputBytes: 4096})
				t.Logf("exec: exit %d, err %v, stderr tail %q", res.ExitCode, err, lastLine(res.Stderr))
			}()
			defer func() { cancel(); <-done }()
			if !waitForFile(t, sb, "written", done) {
				return // stopped before it wrote it all: a memory cgroup's OOM kill
			}
			var held int64
			for _, proc := range hostProcesses(t, mark) {
				pid, _, _ := strings.Cut(proc, ":")
				var used int64
				seen := map[unix.Fsid]bool{} // /dev/shm was a folder of /dev
				for _, dir := range []string{"dev", "dev/shm"} {
					var st unix.Statfs_t
					if err := unix.Statfs(filepath.Join("/proc", pid, "root", dir), &st); err == nil && !seen[st.Fsid] {
						seen[st.Fsid] = true
						used += int64(st.Blocks-st.Bfree) * st.Bsize
					}
				}
				held = max(held, used)
			}
			t.Logf("the sandbox's /dev and /dev/shm hold %d bytes of the host's memory", held)
			if ceiling := int64(17 << 20); held > ceiling {
				t.Errorf("a command of a sandbox with 16 MiB of disk holds %d bytes in /dev and /dev/shm; want at most %d", held, ceiling)
			}
		})
	}
}

// sysvIPCAttack asks for a message queue and a semaphore set, then makes System V shared memory
// segments of 64 MiB, touches each and detaches it, up to six (384 MiB): a detached segment
// stays in the IPC namespace after its maker has gone. The shell then lists the namespace's
// segments (the kernel's /proc/sysvipc/shm).
const sysvIPCAttack = `python3 -c '
import ctypes
libc = ctypes.CDLL(None, use_errno=True)
libc.shmat.restype, libc.shmat.argtypes = ctypes.c_void_p, (ctypes.c_int, ctypes.c_void_p, ctypes.c_int)
libc.shmdt.argtypes = (ctypes.c_void_p,)
def result(r):
    return "ok" if r >= 0 else "errno=%d" % ctypes.get_errno()
print("msgget", result(libc.msgget(0, 0o1600)))
print("semget", result(libc.semget(0, 1, 0o1600)))
made, size = 0, 64 << 20
for i in range(6):
    seg = libc.shmget(0, size, 0o1600)
    print("shmget", result(seg))
    if seg < 0:
        break
    addr = libc.shmat(seg, None, 0)
    if addr is None or addr == ctypes.c_void_p(-1).value:
        print("shmat", result(-1))
        break
    ctypes.memset(addr, 1, size)
    libc.shmdt(ctypes.c_void_p(addr))
    made += 1
    print("segments", made, flush=True)
'; echo listing; cat /proc/sysvipc/shm`

// TestContainmentSysVIPCBounded: System V IPC objects live in the sandbox's IPC namespace until
// the Exec's last process ends, whoever made them, and RLIMIT_AS counts none of them (a segment
// once detached, a queued message, a semaphore). Where a memory cgroup is in force it counts
// them, and the calls work; rlimits only, the seccomp filter answers ENOSYS to the whole family,
// as a kernel without System V IPC would. Before, rlimits only, a command with 128 MiB of memory
// left 384 MiB of touched segments behind.
func TestContainmentSysVIPCBounded(t *testing.T) {
	t.Parallel()
	for _, mode := range boundModes {
		t.Run(mode.name, func(t *testing.T) {
			t.Parallel()
			sb := sandboxtest.StartSpec(t, sandboxtest.Bubblewrap(t, mode.edit), bombSpec)
			iso := sb.Info().Isolation
			memoryCgroup := strings.Contains(iso, "cgroup-v") && strings.Contains(iso, "memory")
			res, err := runBomb(t, sb, sysvIPCAttack, 60*time.Second)
			if err != nil {
				t.Fatalf("exec: %v", err)
			}
			out, listing, ok := strings.Cut(string(res.Stdout), "listing\n")
			if !ok {
				t.Fatalf("no listing of the segments: stdout %q, stderr %q", res.Stdout, res.Stderr)
			}
			t.Logf("isolation %s\n%s", iso, out)
			held := sysvShmResident(t, listing)
			t.Logf("the sandbox's IPC namespace holds %d bytes of System V shared memory", held)
			// The memory bound, and with a memory cgroup the workdir's tmpfs it also counts.
			ceiling := int64(128 << 20)
			want, filter := "errno=38", "boxcar-nosysvipc-v1"
			if memoryCgroup {
				ceiling, want, filter = (128+17+1)<<20, "ok", "boxcar-default-v1"
			}
			if got := sb.Info().Seccomp; got != filter {
				t.Errorf("the sandbox runs under the filter %q; want %q with a memory cgroup %v", got, filter, memoryCgroup)
			}
			if held > ceiling {
				t.Errorf("a command of a sandbox with 128 MiB of memory left %d bytes of System V shared memory; want at most %d (%s)", held, ceiling, iso)
			}
			for _, call := range []string{"msgget", "semget", "shmget"} {
				if !strings.Contains(out, call+" "+want+"\n") {
					t.Errorf("%s: want %q with a memory cgroup %v; got:\n%s", call, want, memoryCgroup, out)
				}
			}
			expectUsable(t, sb)
		})
	}
}

// sysvShmResident sums the rss column of a /proc/sysvipc/shm listing.
func sysvShmResident(t *testing.T, listing string) int64 {
	t.Helper()
	lines := strings.Split(strings.TrimSpace(listing), "\n")
	col := slices.Index(strings.Fields(lines[0]), "rss")
	if col < 0 {
		t.Fatalf("no rss column in /proc/sysvipc/shm: %q", listing)
	}
	var sum int64
	for _, line := range lines[1:] {
		f := strings.Fields(line)
		if len(f) <= col {
			t.Fatalf("a /proc/sysvipc/shm line without rss: %q", line)
		}
		n, err := strconv.ParseInt(f[col], 10, 64)
		if err != nil {
			t.Fatalf("rss %q: %v", f[col], err)
		}
		sum += n
	}
	return sum
}

// waitForFile waits for the command to write name into the workdir: false if done closes
// first (the command ended).
func waitForFile(t *testing.T, sb sandbox.Sandbox, name string, done <-chan struct{}) bool {
	t.Helper()
	written := false
	harness.Wait(t, "the command to write "+name, func() (bool, error) {
		_, err := sb.ReadFile(t.Context(), name, 10)
		if written = err == nil; written {
			return true, nil
		}
		select {
		case <-done:
			return true, nil
		default:
			return false, err
		}
	})
	return written
}

// TestContainmentNoNestedUserNamespaces: they widen the kernel's attack surface.
func TestContainmentNoNestedUserNamespaces(t *testing.T) {
	t.Parallel()
	sb := sandboxtest.StartSpec(t, sandboxtest.Bubblewrap(t), config.SandboxSpec{})
	if res := run(t, sb, "unshare", "--user", "--map-root-user", "true"); res.ExitCode == 0 {
		t.Errorf("unshare --user succeeded inside the sandbox")
	}
}

// TestContainmentHostNameHidden checks the sandbox has a host name of its own.
func TestContainmentHostNameHidden(t *testing.T) {
	t.Parallel()
	sb := sandboxtest.StartSpec(t, sandboxtest.Bubblewrap(t), config.SandboxSpec{})
	if got := strings.TrimSpace(string(run(t, sb, "cat", "/proc/sys/kernel/hostname").Stdout)); got != "boxcar" {
		t.Errorf("hostname inside = %q, want boxcar", got)
	}
}

// bombSpec bounds the resource attacks below.
var bombSpec = config.SandboxSpec{Memory: "128Mi", PIDs: 32, Disk: "16Mi", CPU: "1"}

// runBomb runs script under timeout and checks it ends within timeout + 5 s, whatever it does.
func runBomb(t *testing.T, sb sandbox.Sandbox, script string, timeout time.Duration) (sandbox.ExecResult, error) {
	t.Helper()
	begin := time.Now()
	res, err := sb.Exec(t.Context(), sandbox.ExecRequest{Argv: []string{"sh", "-c", script}, Timeout: timeout, MaxOutputBytes: 4096})
	if elapsed := time.Since(begin); elapsed > timeout+5*time.Second {
		t.Errorf("Exec returned after %v, want within the %v timeout + 5s", elapsed, timeout)
	}
	t.Logf("exit %d, timed out %v, err %v, stderr tail %q", res.ExitCode, res.TimedOut, err, lastLine(res.Stderr))
	return res, err
}

// expectUsable checks the sandbox still runs commands after an attack.
func expectUsable(t *testing.T, sb sandbox.Sandbox) {
	t.Helper()
	if res := run(t, sb, "echo", "alive"); res.ExitCode != 0 || string(res.Stdout) != "alive\n" {
		t.Errorf("after the attack: exit %d, stdout %q; want the sandbox usable", res.ExitCode, res.Stdout)
	}
}

// TestContainmentForkBomb forks without end until the timeout. The process bound holds it, the
// host keeps forking while the bomb is at its bound, and nothing of it survives. Each of the
// bomb's shells forks in a loop and exits at its first refused fork, saying so in the workdir,
// so a refusal frees a place that another shell takes and the bomb stays at its bound until
// the timeout; the command's own shell, its one fork done, becomes sleep. (`f() { f | f & }`
// died out a moment after its first refusals, and the host was checked a second later.)
func TestContainmentForkBomb(t *testing.T) {
	t.Parallel()
	for _, mode := range boundModes {
		t.Run(mode.name, func(t *testing.T) {
			t.Parallel()
			sb := sandboxtest.StartSpec(t, sandboxtest.Bubblewrap(t, mode.edit), bombSpec)
			if iso := sb.Info().Isolation; !strings.Contains(iso, "nproc") && !strings.Contains(iso, "pids") {
				t.Skipf("no process bound is in force here, so a fork bomb would hit the host (the worker is not root and has no pids cgroup): %s", iso)
			}
			st := sandbox.BubblewrapHostState(sb)
			done := make(chan struct{})
			go func() {
				defer close(done)
				res, err := runBomb(t, sb, `f() { while :; do f & done; }; exec 2>refused; f & exec sleep 100`, 3*time.Second)
				if err != nil || !res.TimedOut {
					t.Errorf("fork bomb: err %v, exit %d, timed out %v; want it held at its bound until the timeout", err, res.ExitCode, res.TimedOut)
				}
			}()
			waitForkRefused(t, st, "refused", done)
			sandboxtest.ExpectHostForks(t)
			<-done
			expectHostUnharmed(t, st)
			expectUsable(t, sb)
		})
	}
}

// waitForkRefused waits until a command's shells, their stderr sent to the workdir file name,
// have said a fork was refused: the sandbox's processes are at its bound (its RLIMIT_NPROC,
// or its pids cgroup). It fails when done closes first: the command ended before.
func waitForkRefused(t *testing.T, st sandbox.HostState, name string, done <-chan struct{}) {
	t.Helper()
	harness.Wait(t, "a fork refused by the sandbox's process bound", func() (bool, error) {
		select {
		case <-done:
			return false, fmt.Errorf("the command ended first: %w", harness.ErrStop)
		default:
		}
		f, err := os.Open(filepath.Join(st.Dir, name))
		if err != nil {
			return false, err
		}
		defer f.Close()
		head := make([]byte, 256)
		n, _ := io.ReadFull(f, head)
		return bytes.Contains(head[:n], []byte("fork")), fmt.Errorf("%s holds %q", name, head[:n])
	})
}

// TestContainmentMemoryBomb allocates and touches memory without end. The memory bound ends it
// with a clear result long before the timeout.
func TestContainmentMemoryBomb(t *testing.T) {
	t.Parallel()
	for _, mode := range boundModes {
		t.Run(mode.name, func(t *testing.T) {
			t.Parallel()
			sb := sandboxtest.StartSpec(t, sandboxtest.Bubblewrap(t, mode.edit), bombSpec)
			st := sandbox.BubblewrapHostState(sb)
			res, err := runBomb(t, sb, `exec python3 -c 'b = []
while True: b.append(b"x" * (1 << 20))'`, 20*time.Second)
			if err != nil || res.TimedOut || res.ExitCode == 0 {
				t.Errorf("memory bomb: err %v, timed out %v, exit %d; want it stopped by the bound with a non-zero exit", err, res.TimedOut, res.ExitCode)
			}
			if !bytes.Contains(res.Stderr, []byte("MemoryError")) && !bytes.Contains(res.Stderr, []byte("out of memory")) {
				t.Errorf("memory bomb: stderr %q does not say the memory ran out", res.Stderr)
			}
			expectHostUnharmed(t, st)
			expectUsable(t, sb)
		})
	}
}

// TestContainmentDiskFill writes files as fast as it can. The workdir bound ends it with
// ErrDiskFull, and the host's disk holds little more than the bound meanwhile.
func TestContainmentDiskFill(t *testing.T) {
	t.Parallel()
	const bound = 16 << 20
	tests := []struct {
		name, script string
	}{
		{name: "many files", script: `i=0; while :; do head -c 1048576 /dev/zero > f$i; i=$((i+1)); done`},
		{name: "files just under the file bound", script: `i=0; while :; do head -c 16000000 /dev/zero > f$i; i=$((i+1)); done`},
	}
	for _, mode := range boundModes {
		for _, tt := range tests {
			t.Run(mode.name+"/"+tt.name, func(t *testing.T) {
				t.Parallel()
				sb := sandboxtest.StartSpec(t, sandboxtest.Bubblewrap(t, mode.edit), bombSpec)
				st := sandbox.BubblewrapHostState(sb)
				_, err := runBomb(t, sb, tt.script, 20*time.Second)
				if !errors.Is(err, sandbox.ErrDiskFull) {
					t.Errorf("disk fill: err = %v, want ErrDiskFull", err)
				}
				out, err := exec.Command("du", "-s", "-B1", st.Dir).Output()
				if err != nil {
					t.Fatal(err)
				}
				used, _ := strconv.ParseInt(strings.Fields(string(out))[0], 10, 64)
				t.Logf("the workdir holds %d bytes after the kill; bound %d", used, bound)
				// The bound is polled, so a busy machine lets some writes through before the
				// kill; what matters is that the overshoot stays small next to the host's disk.
				if used > 16*bound {
					t.Errorf("the workdir grew to %d bytes on the host, over 16 times its %d-byte bound", used, bound)
				}
				run(t, sb, "sh", "-c", "rm -f f*")
				expectHostUnharmed(t, st)
				expectUsable(t, sb)
			})
		}
	}
	t.Run("tmp", func(t *testing.T) {
		t.Parallel()
		sb := sandboxtest.StartSpec(t, sandboxtest.Bubblewrap(t), bombSpec)
		res, err := runBomb(t, sb, `i=0; while head -c 1048576 /dev/zero > /tmp/f$i; do i=$((i+1)); done; echo "stopped at $i" >&2; exit 1`, 20*time.Second)
		if err != nil || res.ExitCode == 0 || !bytes.Contains(res.Stderr, []byte("stopped at")) {
			t.Errorf("/tmp fill: err %v, exit %d, stderr %q; want the writes refused", err, res.ExitCode, res.Stderr)
		}
	})
}

// TestContainmentCPUSpin spins several processes past the timeout: they are killed on time, and
// the host keeps running meanwhile.
func TestContainmentCPUSpin(t *testing.T) {
	t.Parallel()
	for _, mode := range boundModes {
		t.Run(mode.name, func(t *testing.T) {
			t.Parallel()
			sb := sandboxtest.StartSpec(t, sandboxtest.Bubblewrap(t, mode.edit), bombSpec)
			st := sandbox.BubblewrapHostState(sb)
			done := make(chan struct{})
			go func() {
				defer close(done)
				res, err := runBomb(t, sb, `for i in 1 2 3; do (while :; do :; done) & done; : > spinning; while :; do :; done`, 2*time.Second)
				if err != nil || !res.TimedOut {
					t.Errorf("CPU spin: err %v, timed out %v; want a timed-out result", err, res.TimedOut)
				}
			}()
			if !waitForFile(t, sb, "spinning", done) {
				t.Fatal("the spin ended before its processes started")
			}
			sandboxtest.ExpectHostForks(t) // while it spins
			<-done
			expectHostUnharmed(t, st)
			expectUsable(t, sb)
		})
	}
}

// TestContainmentGoneAfterClose closes a sandbox with a command running and checks nothing of
// it is left on the host: no process, no workdir, no lock file, no cgroup.
func TestContainmentGoneAfterClose(t *testing.T) {
	t.Parallel()
	p := sandboxtest.Bubblewrap(t)
	sb, err := p.Start(t.Context(), sandboxtest.Spec("gone", config.SandboxSpec{}))
	if err != nil {
		t.Fatal(err)
	}
	st := sandbox.BubblewrapHostState(sb)
	marker := fmt.Sprintf("100.%d", time.Now().UnixNano()%1_000_000_000)
	if err := sb.WriteFile(t.Context(), "in/data.txt", []byte("input")); err != nil {
		t.Fatal(err)
	}
	// A command left running, with a detached child and a folder it made read-only.
	done := make(chan error, 1)
	go func() {
		_, err := sb.Exec(context.WithoutCancel(t.Context()), sandbox.ExecRequest{Argv: []string{"sh", "-c",
			"mkdir -p ro/sub && chmod 0500 ro/sub ro && setsid sleep " + marker + " </dev/null >/dev/null 2>&1 & echo > started; sleep " + marker}})
		done <- err
	}()
	harness.Wait(t, "the command to start", func() (bool, error) {
		_, err := sb.ReadFile(t.Context(), "started", 10)
		return err == nil, err
	}, harness.Within(10*time.Second))
	for _, path := range st.Paths() {
		if _, err := os.Stat(path); err != nil {
			t.Fatalf("before Close: %s: %v", path, err)
		}
	}
	if err := sb.Close(t.Context()); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if err := <-done; !errors.Is(err, sandbox.ErrClosed) {
		t.Errorf("the running command: err = %v, want ErrClosed", err)
	}
	for _, path := range st.Paths() {
		if _, err := os.Lstat(path); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("after Close: %s is still there (%v)", path, err)
		}
	}
	if left := hostProcesses(t, marker); len(left) != 0 {
		t.Errorf("after Close: processes of the sandbox still run: %v", left)
	}
	expectHostUnharmed(t, st)
}
