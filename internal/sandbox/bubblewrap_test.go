//go:build integration

package sandbox_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/boxcar-run/boxcar/internal/config"
	"github.com/boxcar-run/boxcar/internal/sandbox"
	"github.com/boxcar-run/boxcar/internal/sandbox/sandboxtest"
	"github.com/boxcar-run/boxcar/test/harness"
)

func withoutCgroups(c *sandbox.BubblewrapConfig) { c.DisableCgroups = true }

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
	sandboxtest.Run(t, func(t *testing.T) sandbox.Provider { return sandboxtest.Bubblewrap(t) })
}

func TestBubblewrapConformanceWithoutCgroups(t *testing.T) {
	sandboxtest.Run(t, func(t *testing.T) sandbox.Provider { return sandboxtest.Bubblewrap(t, withoutCgroups) })
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
	p := sandboxtest.Bubblewrap(t)
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
			sb, err := p.Start(t.Context(), sandboxtest.Spec("bad", tt.spec))
			if err == nil {
				_ = sb.Close(context.Background())
				t.Fatalf("Start succeeded, want an error")
			}
		})
	}
}

func TestExecRejectsBadRequests(t *testing.T) {
	sb := sandboxtest.StartSpec(t, sandboxtest.Bubblewrap(t), config.SandboxSpec{})
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
			p := sandboxtest.Bubblewrap(t, mode.edit)
			sb := sandboxtest.StartSpec(t, p, config.SandboxSpec{Memory: "128Mi", PIDs: 32, Disk: "8Mi"})
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

			t.Run("rlimits as the command sees them", func(t *testing.T) {
				// The worker sets them on bwrap before it forks anything: the command itself
				// must hold them, soft and hard alike.
				limits := string(run(t, sb, "cat", "/proc/self/limits").Stdout)
				want := map[string]string{
					"Max file size":       "8388608 8388608",
					"Max open files":      "1024 1024",
					"Max core file size":  "0 0",
					"Max cpu time":        "3600 3600", // 1 core for the default 1 h lifetime
					"Max address space":   "134217728 134217728",
					"Max processes":       "32 32",
					"Max pending signals": "1024 1024",
				}
				iso := sb.Info().Isolation
				if strings.Contains(iso, "memory") {
					delete(want, "Max address space") // the memory cgroup bounds memory instead
				}
				if !strings.Contains(iso, "nproc") {
					delete(want, "Max processes") // the worker is not root: the pids cgroup bounds them
				}
				for name, values := range want {
					var got string
					for _, line := range strings.Split(limits, "\n") {
						if rest, ok := strings.CutPrefix(line, name); ok {
							got = strings.Join(strings.Fields(rest)[:2], " ")
						}
					}
					if got != values {
						t.Errorf("%s inside the sandbox: %q, want %q (soft hard)\n%s", name, got, values, limits)
					}
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
				// The result comes back with the error: the command either finished before the
				// watcher measured the workdir, or the watcher stopped it as it crossed the bound,
				// or the workdir's filesystem refused the rest of a write (head's exit 1).
				if (res.ExitCode != 0 && res.ExitCode != 137 && res.ExitCode != 1) || res.Duration <= 0 {
					t.Errorf("the result comes back with the error: exit %d, duration %v; want exit 0, 1 or 137", res.ExitCode, res.Duration)
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

// TestReadOfAFolderIsNotRegular: a read of what is not a regular file says so by its class
// (ErrNotRegular), which the manifest tells the tenant in words of its own.
func TestReadOfAFolderIsNotRegular(t *testing.T) {
	sb := sandboxtest.StartSpec(t, sandboxtest.Bubblewrap(t), config.SandboxSpec{})
	if err := sb.WriteFile(t.Context(), "sub/a", []byte("a")); err != nil {
		t.Fatal(err)
	}
	if _, err := sb.ReadFile(t.Context(), "sub", 1<<10); !errors.Is(err, sandbox.ErrNotRegular) || !strings.Contains(fmt.Sprint(err), "is a folder") {
		t.Errorf("ReadFile of a folder: %v; want ErrNotRegular, saying it is a folder", err)
	}
}

// TestTimeoutShorterThanTheLaunchIsTheCommands: a command_timeout that passes before bwrap
// has started (1ns, 1µs) is the command's timeout, as one that passes while it runs: the model
// is told its command timed out. Exec failed with "start /usr/bin/bwrap: context deadline
// exceeded", which the agent tells the model as the job's time running out, the job going on.
func TestTimeoutShorterThanTheLaunchIsTheCommands(t *testing.T) {
	sb := sandboxtest.StartSpec(t, sandboxtest.Bubblewrap(t), config.SandboxSpec{})
	for _, timeout := range []time.Duration{time.Nanosecond, time.Microsecond} {
		res, err := sb.Exec(t.Context(), sandbox.ExecRequest{Argv: []string{"true"}, Timeout: timeout})
		if err != nil || !res.TimedOut || res.ExitCode == 0 {
			t.Errorf("timeout %s: err %v, timed out %v, exit %d; want timed out with a non-zero exit and no error", timeout, err, res.TimedOut, res.ExitCode)
		}
	}
	if res, err := sb.Exec(t.Context(), sandbox.ExecRequest{Argv: []string{"true"}}); err != nil || res.ExitCode != 0 {
		t.Fatalf("the next command: err %v, exit %d; want it run", err, res.ExitCode)
	}
}

// TestTimeoutLeavesNoHostProcess looks for the command's descendants in the host's process
// table, including one that detached into its own session with its output closed.
func TestTimeoutLeavesNoHostProcess(t *testing.T) {
	sb := sandboxtest.StartSpec(t, sandboxtest.Bubblewrap(t), config.SandboxSpec{})
	marker := fmt.Sprintf("100.%d", time.Now().UnixNano()%1_000_000_000)
	script := fmt.Sprintf("setsid sleep %s </dev/null >/dev/null 2>&1 & sleep %s & sleep %s & wait", marker, marker, marker)
	res, err := sb.Exec(t.Context(), sandbox.ExecRequest{Argv: []string{"sh", "-c", script}, Timeout: 300 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	if !res.TimedOut {
		t.Fatalf("TimedOut = false, want true")
	}
	harness.Wait(t, "no process of the command left after its timeout", func() (bool, error) {
		left := hostProcesses(t, marker)
		return len(left) == 0, fmt.Errorf("processes survived the timeout: %v", left)
	}, harness.Within(2*time.Second))
}

// hostProcesses lists the host's processes whose command line holds marker (bwrap itself
// aside), as "pid:cmdline".
func hostProcesses(t *testing.T, marker string) []string {
	t.Helper()
	return hostProcessesWhere(t, func(pid string, cmdline []byte) bool {
		return bytes.Contains(cmdline, []byte(marker)) && !bytes.Contains(cmdline, []byte("bwrap"))
	})
}

// hostProcessesWhere lists the host's processes that match, as "pid:cmdline".
func hostProcessesWhere(t *testing.T, match func(pid string, cmdline []byte) bool) []string {
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
		if err != nil || !match(d.Name(), cmdline) {
			continue
		}
		found = append(found, d.Name()+":"+string(bytes.ReplaceAll(cmdline, []byte{0}, []byte{' '})))
	}
	return found
}

func TestLifetime(t *testing.T) {
	root := sandboxtest.SearchableTempDir(t)
	p := sandboxtest.Bubblewrap(t, func(c *sandbox.BubblewrapConfig) { c.Root = root })
	sb := sandboxtest.StartSpec(t, p, config.SandboxSpec{Lifetime: config.Duration(time.Second)})
	start := time.Now()
	_, err := sb.Exec(t.Context(), sandbox.ExecRequest{Argv: []string{"sleep", "30"}})
	if !errors.Is(err, sandbox.ErrClosed) {
		t.Errorf("Exec across the lifetime: err = %v, want ErrClosed", err)
	}
	if elapsed := time.Since(start); elapsed > 10*time.Second {
		t.Errorf("Exec ran %v past a 1s lifetime", elapsed)
	}
	harness.Wait(t, "the sandbox folder removed after its lifetime", func() (bool, error) {
		entries, err := os.ReadDir(root)
		if err != nil {
			t.Fatal(err)
		}
		return len(entries) == 0, fmt.Errorf("still there: %v", entries)
	}, harness.Within(10*time.Second))
}

// TestImageRootfs runs a static program from a rootfs folder named as the image.
func TestImageRootfs(t *testing.T) {
	image := sandboxtest.SearchableTempDir(t)
	for _, dir := range []string{"bin", "etc"} {
		if err := os.Mkdir(filepath.Join(image, dir), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(image, "etc", "image-marker"), []byte("from the image"), 0o644); err != nil {
		t.Fatal(err)
	}
	// A static busybox is the image's only program: it runs without the host's libraries, so
	// it shows what the sandbox's / holds.
	bb, _ := staticBusybox(t)
	copyProgram(t, bb, filepath.Join(image, "bin", "busybox"))
	if err := os.Chmod(image, 0o755); err != nil { // the sandbox's host user reads the image
		t.Fatal(err)
	}
	sb := sandboxtest.StartSpec(t, sandboxtest.Bubblewrap(t), config.SandboxSpec{Image: image})
	res := run(t, sb, "/bin/busybox", "ls", "-a", "/")
	if got := strings.Fields(string(res.Stdout)); res.ExitCode != 0 || !slices.Equal(got, []string{".", "..", "bin", "dev", "etc", "proc", "tmp", "work"}) {
		t.Errorf("ls / in the sandbox: exit %d, %q (stderr %q); want the image's bin and etc beside the sandbox's own dev, proc, tmp and work", res.ExitCode, res.Stdout, res.Stderr)
	}
	if res := run(t, sb, "/bin/busybox", "cat", "/etc/image-marker"); res.ExitCode != 0 || string(res.Stdout) != "from the image" {
		t.Errorf("cat /etc/image-marker: exit %d, %q (stderr %q); want the image's file", res.ExitCode, res.Stdout, res.Stderr)
	}
	if res := run(t, sb, "/bin/busybox", "touch", "/etc/x"); res.ExitCode == 0 {
		t.Errorf("touch /etc/x succeeded: the image must be read-only")
	}
	if info := sb.Info(); info.Image != image {
		t.Errorf("Info().Image = %q, want %q", info.Image, image)
	}
}

// TestIsolationReport checks that Info says what is in force.
func TestIsolationReport(t *testing.T) {
	// RLIMIT_NPROC is set only where each sandbox has a host uid of its own, which takes root.
	rlimits, uid := "rlimits=fsize,nofile,cpu,core,msgqueue,sigpending,as", "host_uid=worker's"
	if os.Geteuid() == 0 {
		rlimits, uid = "rlimits=nproc,fsize,nofile,cpu,core,msgqueue,sigpending,as", "(own)"
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
			info := sandboxtest.StartSpec(t, sandboxtest.Bubblewrap(t, tt.edit), config.SandboxSpec{}).Info()
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

// TestBubblewrapListIsBounded: a List holds at most sandbox.MaxListing bytes in the worker's
// memory, as a pod's listing does, and fails with ErrTooLarge past it, however the job spread
// its paths: files whose paths are near PATH_MAX (each listed), or empty folders with such
// paths (each held by the walk until it is read). Another folder still lists. The tree is made
// from the host, as the job would make it.
func TestBubblewrapListIsBounded(t *testing.T) {
	t.Parallel()
	n := sandbox.MaxListing/4000 + 500 // each path is about 4 020 bytes
	tests := []struct {
		name string
		make func(dir *os.Root, name string) error
	}{
		{name: "files", make: func(dir *os.Root, name string) error { return dir.WriteFile(name, nil, 0o644) }},
		{name: "empty folders", make: func(dir *os.Root, name string) error { return dir.Mkdir(name, 0o755) }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			sb := sandboxtest.StartSpec(t, sandboxtest.Bubblewrap(t), config.SandboxSpec{Memory: "256Mi", PIDs: 32, Disk: "128Mi", CPU: "1"})
			rel := "out"
			for range 15 {
				rel = filepath.Join(rel, strings.Repeat("d", 250))
			}
			deep := filepath.Join(sandbox.BubblewrapHostState(sb).Dir, rel)
			if err := os.MkdirAll(deep, 0o755); err != nil {
				t.Fatal(err)
			}
			dir, err := os.OpenRoot(deep)
			if err != nil {
				t.Fatal(err)
			}
			defer dir.Close()
			for i := range n {
				// Names of 250 bytes: each path in the workdir stays under PATH_MAX.
				if err := tt.make(dir, strconv.Itoa(i)+strings.Repeat("f", 250-len(strconv.Itoa(i)))); err != nil {
					t.Fatalf("make entry %d: %v", i, errors.Unwrap(err))
				}
			}
			list, err := sb.List(t.Context(), "out")
			if !errors.Is(err, sandbox.ErrTooLarge) || list != nil {
				t.Errorf("List of %d entries with paths of about 4 020 bytes: %d files, err %v; want ErrTooLarge past %d bytes",
					n, len(list), err, sandbox.MaxListing)
			}
			if err := sb.WriteFile(t.Context(), "small/a", []byte("a")); err != nil {
				t.Fatal(err)
			}
			if list, err := sb.List(t.Context(), "small"); err != nil || len(list) != 1 {
				t.Errorf("List of a small folder beside the tree: %v, err %v; want small/a", list, err)
			}
		})
	}
}

func BenchmarkExecTrue(b *testing.B) {
	sb := sandboxtest.StartSpec(b, sandboxtest.Bubblewrap(b), config.SandboxSpec{})
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

// TestBubblewrapWorkersOnOneHostShareNoUID: two workers on one host, on one Root or on two, with
// the same host uid range, never give two live sandboxes one host uid: each picked its uids at
// random, minding only its own, so with a range of one the second worker's sandbox ran as the
// first's uid, sharing its per-uid counters (RLIMIT_NPROC, message queues, pending signals,
// inotify, pipe pages) and its file ownership. The claims were under the Root, so workers on
// two Roots still did (the two Roots row).
func TestBubblewrapWorkersOnOneHostShareNoUID(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("host uids per sandbox are the root worker's")
	}
	t.Parallel()
	for _, tc := range []struct {
		name  string
		roots int
	}{{"one Root", 1}, {"two Roots", 2}} {
		t.Run(tc.name, func(t *testing.T) {
			roots := []string{sandboxtest.SearchableTempDir(t)}
			if tc.roots == 2 {
				roots = append(roots, sandboxtest.SearchableTempDir(t))
			}
			claims := filepath.Join(t.TempDir(), "uids")
			oneUID := func(root string) func(*sandbox.BubblewrapConfig) {
				return func(c *sandbox.BubblewrapConfig) {
					c.Root, c.UIDClaims, c.FirstUID, c.UIDs = root, claims, 1_900_123_456, 1
				}
			}
			workersShareNoUID(t, claims, oneUID(roots[0]), oneUID(roots[len(roots)-1]))
		})
	}
}

// workersShareNoUID starts a sandbox on a worker of first, then one on a worker of second (a
// range of one uid, the same), and checks that the second waits for the first's uid.
func workersShareNoUID(t *testing.T, claims string, first, second func(*sandbox.BubblewrapConfig)) {
	one := sandboxtest.StartSpec(t, sandboxtest.Bubblewrap(t, first), config.SandboxSpec{})
	other := sandboxtest.Bubblewrap(t, second)
	sb, err := other.Start(t.Context(), sandboxtest.Spec("job-2", config.SandboxSpec{}))
	if err == nil {
		defer sb.Close(context.Background())
		t.Fatalf("the second worker started a sandbox as uid %d, the first worker's live sandbox's (%d), its range being that one uid",
			sandbox.BubblewrapHostState(sb).UID, sandbox.BubblewrapHostState(one).UID)
	}
	if err := one.Close(t.Context()); err != nil {
		t.Fatal(err)
	}
	sb, err = other.Start(t.Context(), sandboxtest.Spec("job-3", config.SandboxSpec{}))
	if err != nil {
		t.Fatalf("once the first worker's sandbox was gone, its uid was still not free to the second: %v", err)
	}
	// A worker that dies leaves its claim, which the next worker on the host removes as it
	// starts; its uid is free at once (the kernel dropped the lock).
	sandbox.AbandonUIDClaims(other)
	sandboxtest.Bubblewrap(t, first)
	if entries, err := os.ReadDir(claims); err != nil || len(entries) != 0 {
		t.Errorf("the claims a dead worker left: %v, %v; want them removed by the next worker's start", entries, err)
	}
	_ = sb.Close(t.Context())
}
