package sandbox_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/boxcar-run/boxcar/internal/config"
	"github.com/boxcar-run/boxcar/internal/sandbox"
	"github.com/boxcar-run/boxcar/internal/sandbox/sandboxtest"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// newBubblewrap makes a provider over a fresh root. A host without bubblewrap fails the test with
// the error's advice (`apt-get install -y bubblewrap`): containment must not go untested quietly.
func newBubblewrap(t testing.TB, edit ...func(*sandbox.BubblewrapConfig)) *sandbox.BubblewrapProvider {
	t.Helper()
	cfg := sandbox.BubblewrapConfig{Root: searchableTempDir(t)}
	for _, e := range edit {
		e(&cfg)
	}
	p, err := sandbox.NewBubblewrap(cfg)
	if err != nil {
		t.Fatalf("NewBubblewrap: %v", err)
	}
	return p
}

// searchableTempDir is a temporary folder that other users may pass through (not list):
// sandboxes run as host uids of their own, and bwrap, running as them, resolves paths below it.
func searchableTempDir(t testing.TB) string {
	t.Helper()
	dir := t.TempDir()
	for _, d := range []string{filepath.Dir(dir), dir} {
		if err := os.Chmod(d, 0o711); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

func withoutCgroups(c *sandbox.BubblewrapConfig) { c.DisableCgroups = true }

// start starts a sandbox with spec (unset fields at the profile defaults) and closes it at the end.
func start(t testing.TB, p sandbox.Provider, spec config.SandboxSpec) sandbox.Sandbox {
	t.Helper()
	sb, err := p.Start(context.Background(), sandbox.Spec{JobID: "test", SandboxSpec: spec})
	if err != nil {
		t.Fatalf("Start: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if err := sb.Close(ctx); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	return sb
}

func run(t *testing.T, sb sandbox.Sandbox, argv ...string) sandbox.ExecResult {
	t.Helper()
	res, err := sb.Exec(t.Context(), sandbox.ExecRequest{Argv: argv, Timeout: 30 * time.Second})
	if err != nil {
		t.Fatalf("Exec %q: %v", argv, err)
	}
	return res
}

// py runs a Python script inside the sandbox and requires it to succeed.
func py(t *testing.T, sb sandbox.Sandbox, script string) string {
	t.Helper()
	res := run(t, sb, "python3", "-c", script)
	if res.ExitCode != 0 {
		t.Fatalf("python3 exit %d\nstdout: %s\nstderr: %s", res.ExitCode, res.Stdout, res.Stderr)
	}
	return string(res.Stdout)
}

func TestBubblewrapConformance(t *testing.T) {
	sandboxtest.Run(t, func(t *testing.T) sandbox.Provider { return newBubblewrap(t) })
}

func TestBubblewrapConformanceWithoutCgroups(t *testing.T) {
	sandboxtest.Run(t, func(t *testing.T) sandbox.Provider { return newBubblewrap(t, withoutCgroups) })
}

func TestNewBubblewrapErrors(t *testing.T) {
	tests := []struct {
		name        string
		cfg         sandbox.BubblewrapConfig
		unavailable bool
		advice      string
	}{
		{name: "bwrap missing", cfg: sandbox.BubblewrapConfig{Root: t.TempDir(), BwrapPath: "/nonexistent/bwrap"}, unavailable: true, advice: "apt-get install -y bubblewrap"},
		{name: "bwrap not in PATH", cfg: sandbox.BubblewrapConfig{Root: t.TempDir(), BwrapPath: "boxcar-no-such-bwrap"}, unavailable: true, advice: "apt-get install -y bubblewrap"},
		{name: "no root", cfg: sandbox.BubblewrapConfig{}, advice: "Root is required"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := sandbox.NewBubblewrap(tt.cfg)
			if err == nil {
				t.Fatal("NewBubblewrap succeeded, want an error")
			}
			if got := errors.Is(err, sandbox.ErrUnavailable); got != tt.unavailable {
				t.Errorf("errors.Is(err, ErrUnavailable) = %v, want %v (err: %v)", got, tt.unavailable, err)
			}
			// The advice is the point of this error: the operator copies it.
			if !strings.Contains(err.Error(), tt.advice) {
				t.Errorf("error %q does not tell the operator %q", err, tt.advice)
			}
		})
	}
}

func TestStartRejectsBadSpecs(t *testing.T) {
	p := newBubblewrap(t)
	tests := []struct {
		name string
		spec config.SandboxSpec
	}{
		{name: "relative workdir", spec: config.SandboxSpec{Workdir: "work"}},
		{name: "workdir over /proc", spec: config.SandboxSpec{Workdir: "/proc/x"}},
		{name: "workdir /", spec: config.SandboxSpec{Workdir: "/"}},
		{name: "bad memory", spec: config.SandboxSpec{Memory: "lots"}},
		{name: "negative disk", spec: config.SandboxSpec{Disk: "-1Mi"}},
		{name: "image not a folder", spec: config.SandboxSpec{Image: "docker.io/library/alpine:3"}},
		{name: "image missing", spec: config.SandboxSpec{Image: "/nonexistent/rootfs"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			sb, err := p.Start(t.Context(), sandbox.Spec{JobID: "bad", SandboxSpec: tt.spec})
			if err == nil {
				_ = sb.Close(context.Background())
				t.Fatalf("Start succeeded, want an error")
			}
		})
	}
}

func TestExecRejectsBadRequests(t *testing.T) {
	sb := start(t, newBubblewrap(t), config.SandboxSpec{})
	tests := []struct {
		name string
		req  sandbox.ExecRequest
	}{
		{name: "empty argv", req: sandbox.ExecRequest{}},
		{name: "NUL in an argument", req: sandbox.ExecRequest{Argv: []string{"echo", "a\x00--bind"}}},
		{name: "NUL in an env value", req: sandbox.ExecRequest{Argv: []string{"true"}, Env: map[string]string{"A": "x\x00y"}}},
		{name: "bad env name", req: sandbox.ExecRequest{Argv: []string{"true"}, Env: map[string]string{"A=B": "x"}}},
		{name: "negative timeout", req: sandbox.ExecRequest{Argv: []string{"true"}, Timeout: -1}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if _, err := sb.Exec(t.Context(), tt.req); err == nil {
				t.Errorf("Exec succeeded, want an error")
			}
		})
	}
}

// TestContainment runs break-out attempts from inside the sandbox.
func TestContainment(t *testing.T) {
	p := newBubblewrap(t)
	sb := start(t, p, config.SandboxSpec{})

	t.Run("no network", func(t *testing.T) {
		// Listeners on the host's loopback and on a host abstract unix socket must be out of
		// reach. bwrap brings up a private lo in the sandbox's network namespace, so loopback
		// connects are refused there (nothing listens on it) rather than unreachable; every
		// other address is unreachable: there is no other interface and no route.
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { ln.Close() })
		abstract := "@boxcar-test-" + strconv.FormatInt(time.Now().UnixNano(), 36)
		uln, err := net.Listen("unix", abstract)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { uln.Close() })
		port := ln.Addr().(*net.TCPAddr).Port
		// 192.0.2.1 is TEST-NET-1: not routed anywhere, so nothing leaves even if this failed.
		out := py(t, sb, fmt.Sprintf(`
import socket
targets = [
    ("loopback4", socket.AF_INET, ("127.0.0.1", %d)),
    ("loopback6", socket.AF_INET6, ("::1", %d)),
    ("remote", socket.AF_INET, ("192.0.2.1", 80)),
    ("abstract", socket.AF_UNIX, "\0%s"),
]
for name, fam, addr in targets:
    s = socket.socket(fam, socket.SOCK_STREAM)
    s.settimeout(5)
    try:
        s.connect(addr)
        print(name, "CONNECTED")
    except OSError as e:
        print(name, e.strerror)
print("ifaces", [n for _, n in socket.if_nameindex()])
print("routes", len(open("/proc/net/route").read().splitlines()) - 1)
`, port, port, abstract[1:]))
		if strings.Contains(out, "CONNECTED") {
			t.Fatalf("a connection left the sandbox:\n%s", out)
		}
		for _, want := range []string{"loopback4 Connection refused", "loopback6 Connection refused", "remote Network is unreachable", "abstract Connection refused", "ifaces ['lo']", "routes 0"} {
			if !strings.Contains(out, want) {
				t.Errorf("want %q, got:\n%s", want, out)
			}
		}
	})

	t.Run("no host home or secrets in the filesystem", func(t *testing.T) {
		out := py(t, sb, `
import os
for p in ["/root", "/home", "/etc/shadow", "/etc/gshadow", "/etc/ssh", "/var", "/sys", "/run", "/mnt", "/opt", "/srv"]:
    print(p, os.path.exists(p))
print("etc", sorted(os.listdir("/etc")))
print("root", sorted(os.listdir("/")))
`)
		if strings.Contains(out, "True") {
			t.Errorf("host paths visible inside:\n%s", out)
		}
		want := "etc ['alternatives', 'group', 'hosts', 'ld.so.cache', 'nsswitch.conf', 'passwd']"
		if !strings.Contains(out, want) {
			t.Errorf("want /etc to hold only the synthesised files (%s), got:\n%s", want, out)
		}
	})

	t.Run("no capabilities, not root", func(t *testing.T) {
		out := py(t, sb, `
import os
print("uid", os.getuid(), os.geteuid(), os.getgid())
for line in open("/proc/self/status"):
    if line.startswith("Cap"):
        print(line.strip().replace("\t", " "))
print("nnp", [l.split()[1] for l in open("/proc/self/status") if l.startswith("NoNewPrivs")])
`)
		for _, want := range []string{"uid 1000 1000 1000", "CapInh: 0000000000000000", "CapPrm: 0000000000000000", "CapEff: 0000000000000000", "CapBnd: 0000000000000000", "CapAmb: 0000000000000000"} {
			if !strings.Contains(out, want) {
				t.Errorf("want %q, got:\n%s", want, out)
			}
		}
	})

	t.Run("host devices not owned", func(t *testing.T) {
		// Were the sandbox host root (even mapped), it would own /dev/null and could chmod the
		// host's node. Unmapped owners show as the overflow id 65534.
		res := run(t, sb, "stat", "-c", "%u", "/dev/null", "/usr/bin/sh")
		if got := strings.Fields(string(res.Stdout)); len(got) != 2 || got[0] == "1000" || got[1] == "1000" {
			t.Errorf("owners of /dev/null and /usr/bin/sh inside = %q, want neither to be the sandbox user 1000", got)
		}
	})

	t.Run("pid namespace", func(t *testing.T) {
		hostInit, err := os.ReadFile("/proc/1/cmdline")
		if err != nil {
			t.Fatal(err)
		}
		out := py(t, sb, `
import os
pids = [p for p in os.listdir("/proc") if p.isdigit()]
print("count", len(pids))
print("init", open("/proc/1/cmdline", "rb").read().split(b"\0")[0].decode())
`)
		var count int
		var init string
		fmt.Sscanf(out, "count %d\ninit %s", &count, &init)
		if count < 1 || count > 4 {
			t.Errorf("the sandbox sees %d processes, want only its own few:\n%s", count, out)
		}
		if want := string(bytes.Split(hostInit, []byte{0})[0]); init == want && !strings.Contains(init, "bwrap") {
			t.Errorf("/proc/1 inside is the host's init %q", init)
		}
		if !strings.HasSuffix(init, "bwrap") {
			t.Errorf("/proc/1 inside is %q, want bwrap's reaper", init)
		}
	})

	t.Run("secret env var", func(t *testing.T) {
		// Parent test is not parallel, so t.Setenv is allowed here.
		secret := "boxcar-secret-" + strconv.FormatInt(time.Now().UnixNano(), 36)
		t.Setenv("BOXCAR_TEST_SECRET", secret)
		res := run(t, sb, "sh", "-c", "env; cat /proc/1/environ /proc/self/environ | tr '\\0' '\\n'")
		if bytes.Contains(res.Stdout, []byte(secret)) || bytes.Contains(res.Stdout, []byte("BOXCAR_TEST_SECRET")) {
			t.Errorf("the worker's environment leaked in:\n%s", res.Stdout)
		}
		for _, want := range []string{"PATH=/usr/local/bin:/usr/bin:/bin", "HOME=/work", "LANG=C.UTF-8"} {
			if !bytes.Contains(res.Stdout, []byte(want)) {
				t.Errorf("env lacks %s:\n%s", want, res.Stdout)
			}
		}
	})

	t.Run("read-only root", func(t *testing.T) {
		out := py(t, sb, `
import os
for p in ["/x", "/usr/x", "/etc/x", "/bin/x", "/etc/passwd", "/proc/sys/kernel/hostname", "/work/ok", "/tmp/ok"]:
    try:
        with open(p, "a") as f:
            f.write("x")
        print(p, "WRITABLE")
    except OSError as e:
        print(p, "refused", e.strerror)
`)
		for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
			writable := strings.HasSuffix(line, "WRITABLE")
			shouldBe := strings.HasPrefix(line, "/work/") || strings.HasPrefix(line, "/tmp/")
			if writable != shouldBe {
				t.Errorf("%s (want writable only under /work and /tmp)", line)
			}
		}
	})

	t.Run("no nested user namespaces", func(t *testing.T) {
		res := run(t, sb, "unshare", "--user", "--map-root-user", "true")
		if res.ExitCode == 0 {
			t.Errorf("unshare --user succeeded inside the sandbox; nested user namespaces widen the kernel's attack surface")
		}
	})

	t.Run("host name hidden", func(t *testing.T) {
		if got := strings.TrimSpace(string(run(t, sb, "cat", "/proc/sys/kernel/hostname").Stdout)); got != "boxcar" {
			t.Errorf("hostname inside = %q, want boxcar", got)
		}
	})
}

// TestResourceLimits checks the bounds with cgroups (where the host has them) and with
// rlimits alone, since production hosts vary.
func TestResourceLimits(t *testing.T) {
	modes := []struct {
		name string
		edit func(*sandbox.BubblewrapConfig)
	}{
		{name: "default", edit: func(*sandbox.BubblewrapConfig) {}},
		{name: "rlimits only", edit: withoutCgroups},
	}
	for _, mode := range modes {
		t.Run(mode.name, func(t *testing.T) {
			t.Parallel()
			p := newBubblewrap(t, mode.edit)
			sb := start(t, p, config.SandboxSpec{Memory: "128Mi", PIDs: 32, Disk: "8Mi"})
			t.Logf("isolation: %s", sb.Info().Isolation)

			t.Run("memory", func(t *testing.T) {
				// Touch every page: untouched allocations cost no memory and would pass.
				const script = `import sys; b = b"x" * (int(sys.argv[1]) << 20); print("allocated", len(b) >> 20)`
				res := run(t, sb, "python3", "-c", script, "32")
				if res.ExitCode != 0 {
					t.Fatalf("allocating a quarter of the limit failed: exit %d, %s", res.ExitCode, res.Stderr)
				}
				res = run(t, sb, "python3", "-c", script, "256")
				t.Logf("allocating 256MiB: exit %d, stderr tail %q", res.ExitCode, lastLine(res.Stderr))
				if res.ExitCode == 0 || bytes.Contains(res.Stdout, []byte("allocated")) {
					t.Errorf("allocating twice the 128Mi limit succeeded: exit %d, stdout %q", res.ExitCode, res.Stdout)
				}
			})

			t.Run("pids", func(t *testing.T) {
				if iso := sb.Info().Isolation; !strings.Contains(iso, "nproc") && !strings.Contains(iso, "pids") {
					t.Skipf("no process bound is in force here (the worker is not root and has no pids cgroup): %s", iso)
				}
				// A bounded fork loop: children sleep and die with the namespace when the
				// parent exits, so nothing escapes even if the bound did not hold.
				out := py(t, sb, `
import os, time
n = 0
for _ in range(500):
    try:
        pid = os.fork()
    except OSError:
        break
    if pid == 0:
        time.sleep(60)
        os._exit(0)
    n += 1
print(n)
`)
				n, err := strconv.Atoi(strings.TrimSpace(out))
				if err != nil {
					t.Fatalf("fork count %q: %v", out, err)
				}
				t.Logf("forked %d children under pids=32", n)
				if n >= 32 || n < 16 {
					t.Errorf("forked %d children under a limit of 32 processes, want fewer than 32 (and more than a handful)", n)
				}
			})

			t.Run("file size", func(t *testing.T) {
				res := run(t, sb, "sh", "-c", "head -c 16777216 /dev/zero > big.bin")
				t.Logf("16MiB file: exit %d, stderr %q", res.ExitCode, lastLine(res.Stderr))
				if res.ExitCode == 0 {
					t.Errorf("writing 16MiB into one file under an 8Mi disk bound succeeded")
				}
				files, err := sb.List(t.Context(), ".")
				if err != nil {
					t.Fatal(err)
				}
				for _, f := range files {
					if f.Size > 8<<20 {
						t.Errorf("%s holds %d bytes, over the 8Mi bound", f.Path, f.Size)
					}
				}
				run(t, sb, "rm", "-f", "big.bin")
			})

			t.Run("tmp size", func(t *testing.T) {
				// Two files, each under the file size limit, together over the tmpfs size.
				res := run(t, sb, "sh", "-c", "head -c 5000000 /dev/zero > /tmp/a.bin && head -c 5000000 /dev/zero > /tmp/b.bin")
				t.Logf("2×5MB in /tmp: exit %d, stderr %q", res.ExitCode, lastLine(res.Stderr))
				if res.ExitCode == 0 {
					t.Errorf("writing 10MB into /tmp under an 8Mi bound succeeded")
				}
			})

			t.Run("workdir total", func(t *testing.T) {
				res, err := sb.Exec(t.Context(), sandbox.ExecRequest{Argv: []string{"sh", "-c", "head -c 5000000 /dev/zero > a.bin; head -c 5000000 /dev/zero > b.bin"}})
				if !errors.Is(err, sandbox.ErrDiskFull) {
					t.Errorf("two 5MB files under an 8Mi bound: err = %v, want ErrDiskFull", err)
				}
				if res.ExitCode != 0 {
					t.Errorf("the result comes back with the error: exit %d, want 0", res.ExitCode)
				}
				if err := sb.WriteFile(t.Context(), "c.bin", make([]byte, 1<<20)); !errors.Is(err, sandbox.ErrDiskFull) {
					t.Errorf("WriteFile over the bound: err = %v, want ErrDiskFull", err)
				}
				// The job can recover by removing files.
				run(t, sb, "rm", "a.bin", "b.bin")
				if err := sb.WriteFile(t.Context(), "c.bin", make([]byte, 1<<20)); err != nil {
					t.Errorf("WriteFile after freeing space: %v", err)
				}
				run(t, sb, "rm", "c.bin")
			})

			t.Run("workdir growth during a command", func(t *testing.T) {
				start := time.Now()
				_, err := sb.Exec(t.Context(), sandbox.ExecRequest{
					Argv:    []string{"sh", "-c", "i=0; while true; do head -c 1048576 /dev/zero > f$i; i=$((i+1)); sleep 0.05; done"},
					Timeout: 30 * time.Second,
				})
				if !errors.Is(err, sandbox.ErrDiskFull) {
					t.Errorf("endless writer: err = %v, want ErrDiskFull", err)
				}
				if elapsed := time.Since(start); elapsed > 10*time.Second {
					t.Errorf("endless writer ran %v, want it killed within a few poll intervals", elapsed)
				}
				run(t, sb, "sh", "-c", "rm -f f*")
			})
		})
	}
}

func lastLine(b []byte) string {
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	return lines[len(lines)-1]
}

// TestTimeoutLeavesNoHostProcess looks for the command's descendants in the host's process
// table, including one that detached into its own session with its output closed.
func TestTimeoutLeavesNoHostProcess(t *testing.T) {
	sb := start(t, newBubblewrap(t), config.SandboxSpec{})
	marker := fmt.Sprintf("100.%d", time.Now().UnixNano()%1_000_000_000)
	script := fmt.Sprintf("setsid sleep %s </dev/null >/dev/null 2>&1 & sleep %s & sleep %s & wait", marker, marker, marker)
	res, err := sb.Exec(t.Context(), sandbox.ExecRequest{Argv: []string{"sh", "-c", script}, Timeout: 300 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	if !res.TimedOut {
		t.Fatalf("TimedOut = false, want true")
	}
	deadline := time.Now().Add(2 * time.Second)
	for {
		left := hostProcesses(t, marker)
		if len(left) == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("processes survived the timeout: %v", left)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func hostProcesses(t *testing.T, marker string) []string {
	t.Helper()
	dirs, err := os.ReadDir("/proc")
	if err != nil {
		t.Fatal(err)
	}
	var found []string
	for _, d := range dirs {
		if _, err := strconv.Atoi(d.Name()); err != nil {
			continue
		}
		cmdline, err := os.ReadFile(filepath.Join("/proc", d.Name(), "cmdline"))
		if err != nil || !bytes.Contains(cmdline, []byte(marker)) || bytes.Contains(cmdline, []byte("bwrap")) {
			continue
		}
		found = append(found, d.Name()+":"+string(bytes.ReplaceAll(cmdline, []byte{0}, []byte{' '})))
	}
	return found
}

func TestLifetime(t *testing.T) {
	root := searchableTempDir(t)
	p := newBubblewrap(t, func(c *sandbox.BubblewrapConfig) { c.Root = root })
	sb := start(t, p, config.SandboxSpec{Lifetime: config.Duration(time.Second)})
	start := time.Now()
	_, err := sb.Exec(t.Context(), sandbox.ExecRequest{Argv: []string{"sleep", "30"}})
	if !errors.Is(err, sandbox.ErrClosed) {
		t.Errorf("Exec across the lifetime: err = %v, want ErrClosed", err)
	}
	if elapsed := time.Since(start); elapsed > 10*time.Second {
		t.Errorf("Exec ran %v past a 1s lifetime", elapsed)
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		entries, err := os.ReadDir(root)
		if err != nil {
			t.Fatal(err)
		}
		if len(entries) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("sandbox folder still there after its lifetime: %v", entries)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestImageRootfs runs a static program from a rootfs folder named as the image.
func TestImageRootfs(t *testing.T) {
	image := searchableTempDir(t)
	for _, dir := range []string{"bin", "etc"} {
		if err := os.Mkdir(filepath.Join(image, dir), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(image, "etc", "image-marker"), []byte("from the image"), 0o644); err != nil {
		t.Fatal(err)
	}
	src := filepath.Join(t.TempDir(), "main.go")
	prog := `package main

import ("fmt"; "os")

func main() {
	entries, _ := os.ReadDir("/")
	for _, e := range entries { fmt.Print(e.Name(), " ") }
	b, err := os.ReadFile("/etc/image-marker")
	fmt.Println("|", string(b), err)
	if err := os.WriteFile("/etc/x", nil, 0o644); err == nil { fmt.Println("IMAGE WRITABLE") }
}
`
	if err := os.WriteFile(src, []byte(prog), 0o644); err != nil {
		t.Fatal(err)
	}
	build := exec.Command("go", "build", "-o", filepath.Join(image, "bin", "probe"), src)
	build.Env = append(os.Environ(), "CGO_ENABLED=0", "GOFLAGS=-buildvcs=false")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("build the probe: %v\n%s", err, out)
	}
	if err := os.Chmod(image, 0o755); err != nil { // the sandbox's host user reads the image
		t.Fatal(err)
	}
	sb := start(t, newBubblewrap(t), config.SandboxSpec{Image: image})
	res := run(t, sb, "/bin/probe")
	out := string(res.Stdout)
	if res.ExitCode != 0 || !strings.Contains(out, "| from the image <nil>") {
		t.Fatalf("probe: exit %d, stdout %q, stderr %q", res.ExitCode, out, res.Stderr)
	}
	if strings.Contains(out, "usr") || strings.Contains(out, "IMAGE WRITABLE") {
		t.Errorf("want only the image, read-only, at /: %q", out)
	}
	if info := sb.Info(); info.Image != image {
		t.Errorf("Info().Image = %q, want %q", info.Image, image)
	}
}

// TestIsolationReport checks that Info says what is in force.
func TestIsolationReport(t *testing.T) {
	// RLIMIT_NPROC is set only where each sandbox has a host uid of its own, which takes root.
	rlimits, uid := "rlimits=fsize,nofile,cpu,core,as", "host_uid=worker's"
	if os.Geteuid() == 0 {
		rlimits, uid = "rlimits=nproc,fsize,nofile,cpu,core,as", "(own)"
	}
	tests := []struct {
		name string
		edit func(*sandbox.BubblewrapConfig)
		want []string
	}{
		{name: "rlimits only", edit: withoutCgroups, want: []string{"cgroup=none", rlimits, "network=none", uid}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			info := start(t, newBubblewrap(t, tt.edit), config.SandboxSpec{}).Info()
			for _, want := range tt.want {
				if !strings.Contains(info.Isolation, want) {
					t.Errorf("Isolation %q lacks %q", info.Isolation, want)
				}
			}
			if info.Memory != "512Mi" || info.PIDs != 128 || info.CPU != "1" || info.Disk != "256Mi" {
				t.Errorf("Info() = %+v, want the profile defaults", info)
			}
		})
	}
}

func BenchmarkExecTrue(b *testing.B) {
	sb := start(b, newBubblewrap(b), config.SandboxSpec{})
	ctx := context.Background()
	req := sandbox.ExecRequest{Argv: []string{"true"}, Timeout: 30 * time.Second}
	for b.Loop() {
		res, err := sb.Exec(ctx, req)
		if err != nil || res.ExitCode != 0 {
			b.Fatalf("exec true: %v, exit %d, stderr %q", err, res.ExitCode, res.Stderr)
		}
	}
}

// BenchmarkHostExecTrue is the baseline for BenchmarkExecTrue: the same program without a
// sandbox.
func BenchmarkHostExecTrue(b *testing.B) {
	for b.Loop() {
		if err := exec.Command("/bin/true").Run(); err != nil {
			b.Fatal(err)
		}
	}
}
