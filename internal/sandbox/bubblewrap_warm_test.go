//go:build integration

package sandbox_test

import (
	"context"
	"debug/elf"
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
)

// TestBubblewrapWarmConformance runs the conformance suite on sandboxes taken warm from a pool
// while another job ran beside each: a warm sandbox behaves as a cold one.
func TestBubblewrapWarmConformance(t *testing.T) {
	sandboxtest.Run(t, func(t *testing.T) sandbox.Provider { return sandboxtest.Warm(t, sandboxtest.Bubblewrap(t)) })
}

// TestBubblewrapWarmIsolation: a warm sandbox shows nothing of the job that ran beside it
// while it waited.
func TestBubblewrapWarmIsolation(t *testing.T) {
	t.Parallel()
	sandboxtest.RunWarmIsolation(t, sandboxtest.Bubblewrap(t))
}

// TestEscapeSuiteWarm runs the escape and exhaustion suite on warm sandboxes: bounds counted
// from the claim hold as from a cold start.
func TestEscapeSuiteWarm(t *testing.T) {
	t.Parallel()
	sandboxtest.RunEscape(t, sandboxtest.Warm(t, sandboxtest.Bubblewrap(t)), bubblewrapHost)
}

// TestBubblewrapWarmEgress runs the egress conformance suite on warm sandboxes: the network is
// attached after the claim, and the first command, handed to a spare bwrap started with the
// egress binds, reaches the proxy and nothing else.
func TestBubblewrapWarmEgress(t *testing.T) {
	sandboxtest.RunEgress(t, sandboxtest.Warm(t, sandboxtest.Bubblewrap(t)))
}

// TestBubblewrapWarmFirstCommandAsCold: the first command of a warm sandbox runs on the spare
// bwrap started ahead, and sees what the first command of a cold one sees: the same pid, stdio,
// environment, folder, credentials, filter, limits and root. (Its children's pids start a few
// higher: the helper's runtime threads took some; docs/sandbox.md.)
func TestBubblewrapWarmFirstCommandAsCold(t *testing.T) {
	t.Parallel()
	t.Run("shell spare", func(t *testing.T) { t.Parallel(); warmFirstCommandAsCold(t, sandboxtest.Bubblewrap(t)) })
	t.Run("Go spare", func(t *testing.T) {
		t.Parallel()
		p := sandboxtest.Bubblewrap(t)
		sandbox.UseGoSpare(p)
		warmFirstCommandAsCold(t, p)
	})
}

func warmFirstCommandAsCold(t *testing.T, p *sandbox.BubblewrapProvider) {
	const script = `echo pid=$$; for f in 0 1 2; do readlink /proc/self/fd/$f | cut -d: -f1; done; pwd; env | sort; ` +
		`grep -E '^(Uid|Gid|Groups|CapInh|CapPrm|CapEff|CapBnd|CapAmb|NoNewPrivs|Seccomp):' /proc/self/status; ulimit -a; ls -A /`
	first := func(sb sandbox.Sandbox) string {
		res, err := sb.Exec(t.Context(), sandbox.ExecRequest{Argv: []string{"sh", "-c", script}, Env: map[string]string{"JOB": "x"}, Timeout: 30 * time.Second})
		if err != nil || res.ExitCode != 0 {
			t.Fatalf("exec: %v, exit %d: %s", err, res.ExitCode, res.Stderr)
		}
		return string(res.Stdout)
	}
	cold := first(sandboxtest.StartSpec(t, p, config.SandboxSpec{}))
	warm := startClaimed(t, p)
	if got := first(warm); got != cold {
		t.Errorf("the warm sandbox's first command saw\n%s\nthe cold one's\n%s", got, cold)
	}
	if !sandbox.RanOnSpare(warm) {
		t.Error("the warm sandbox's first command did not run on its spare bwrap")
	}
	if sandbox.RanOnSpare(sandboxtest.StartSpec(t, p, config.SandboxSpec{})) {
		t.Error("a cold sandbox has a spare")
	}
}

// TestBubblewrapSpareKinds: a sandbox on the host's root has the shell spare, also under
// RLIMIT_AS (where no memory cgroup bounds it: dash needs little address space); a sandbox on
// an image's root, which may hold no shell or another one, has the worker's binary, except
// under RLIMIT_AS, where that binary's Go runtime cannot start, and it has none. Each first
// command runs on the spare it has.
// startAhead starts a pool sandbox of the default spec, on image's root ("": the host's), ahead
// of its job, as its pool does: it warms up meanwhile.
func startAhead(t *testing.T, p sandbox.Provider, image string) sandbox.Sandbox {
	t.Helper()
	spec := sandboxtest.Spec("", config.SandboxSpec{})
	spec.Pool, spec.Ahead = "p", time.Hour
	if image != "" {
		spec.Image = image
	}
	sb, err := p.Start(t.Context(), spec)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sb.Close(context.Background()) })
	return sb
}

// spareBubblewrap is bubblewrap with the Go spare or the shell's, bounded by cgroups or, with
// noCgroups, by RLIMIT_AS.
func spareBubblewrap(t *testing.T, goSpare, noCgroups bool) *sandbox.BubblewrapProvider {
	t.Helper()
	p := sandboxtest.Bubblewrap(t, func(c *sandbox.BubblewrapConfig) { c.DisableCgroups = noCgroups })
	if goSpare {
		sandbox.UseGoSpare(p)
	}
	return p
}

// startClaimed starts a pool sandbox of the default spec, lets it warm up as its pool would,
// and claims it for job-1.
func startClaimed(t *testing.T, p sandbox.Provider) sandbox.Sandbox {
	t.Helper()
	warm := startAhead(t, p, "")
	sandbox.AwaitWarm(warm)
	if err := warm.(sandbox.Claimer).Claim(t.Context(), "default", "job-1"); err != nil {
		t.Fatal(err)
	}
	return warm
}

func TestBubblewrapSpareKinds(t *testing.T) {
	t.Parallel()
	// An image gets the worker's binary only where that is linked statically (CGO_ENABLED=0, as
	// make build builds the worker): the image may lack the libraries.
	goOnImage := ""
	if !linkedDynamically(t) {
		goOnImage = "go"
	}
	tests := []struct {
		name      string
		image     bool
		noCgroups bool
		goSpare   bool // UseGoSpare
		want      string
	}{
		{"host root", false, false, false, "shell"},
		{"host root under RLIMIT_AS", false, true, false, "shell"},
		{"host root, the Go spare", false, false, true, "go"},
		{"host root, the Go spare under RLIMIT_AS", false, true, true, ""},
		{"image", true, false, false, goOnImage},
		{"image under RLIMIT_AS", true, true, false, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			image, argv := "", []string{"true"}
			if tt.image {
				image, argv = busyboxImage(t), []string{"/bin/busybox", "true"}
			}
			sb := startAhead(t, spareBubblewrap(t, tt.goSpare, tt.noCgroups), image)
			if underAS := strings.Contains(sb.Info().Isolation, ",as"); underAS != tt.noCgroups {
				t.Fatalf("bounded by RLIMIT_AS: %v, want %v: %s", underAS, tt.noCgroups, sb.Info().Isolation)
			}
			sandbox.AwaitWarm(sb)
			if got := sandbox.SpareKind(sb); got != tt.want {
				t.Fatalf("the spare is %q, want %q", got, tt.want)
			}
			if err := sb.(sandbox.Claimer).Claim(t.Context(), "default", "job-1"); err != nil {
				t.Fatal(err)
			}
			res, err := sb.Exec(t.Context(), sandbox.ExecRequest{Argv: argv, Timeout: 30 * time.Second})
			if err != nil || res.ExitCode != 0 {
				t.Fatalf("exec %v: %v, exit %d: %s", argv, err, res.ExitCode, res.Stderr)
			}
			if sandbox.RanOnSpare(sb) != (tt.want != "") {
				t.Errorf("the first command ran on the spare: %v, want %v", sandbox.RanOnSpare(sb), tt.want != "")
			}
		})
	}
}

func linkedDynamically(t *testing.T) bool {
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	f, err := elf.Open(self)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	return slices.ContainsFunc(f.Progs, func(p *elf.Prog) bool { return p.Type == elf.PT_INTERP })
}

// busyboxImage is a rootfs folder whose only program is a static busybox, at /bin/busybox.
func busyboxImage(t *testing.T) string {
	image := sandboxtest.SearchableTempDir(t)
	if err := os.Mkdir(filepath.Join(image, "bin"), 0o755); err != nil {
		t.Fatal(err)
	}
	bb, _ := staticBusybox(t)
	copyProgram(t, bb, filepath.Join(image, "bin", "busybox"))
	if err := os.Chmod(image, 0o755); err != nil { // the sandbox's host user reads the image
		t.Fatal(err)
	}
	return image
}

// copyProgram copies the program src to dst through cp(1), not through a file this process
// writes: a file open for writing here is held by every child another test forks until that
// child execs, and running the program meanwhile fails with "text file busy" (ETXTBSY,
// golang/go#22315), which TestBubblewrapSpareKinds met under load.
func copyProgram(t *testing.T, src, dst string) {
	t.Helper()
	if out, err := exec.Command("cp", src, dst).CombinedOutput(); err != nil {
		t.Fatalf("cp %s %s: %v: %s", src, dst, err, out)
	}
	if err := os.Chmod(dst, 0o755); err != nil {
		t.Fatal(err)
	}
}

// TestWarmUsageIsTheJobsAlone: the manifest's usage.sandbox (cpu_ms, peak_memory_bytes) is
// what the committing attempt used, for accounting (docs/provenance.md), and a warm sandbox is
// indistinguishable from a cold one in the manifest but for warm and claimed_at. A claimed warm
// sandbox that has run nothing for its job yet counts what a cold one that has run nothing
// counts, not its spare bwrap, which the worker started before the job existed; once its job's
// command held 30 MB, it counts them.
func TestWarmUsageIsTheJobsAlone(t *testing.T) {
	t.Parallel()
	for _, goSpare := range []bool{false, true} {
		name := map[bool]string{false: "shell spare", true: "Go spare"}[goSpare]
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			p := sandboxtest.Bubblewrap(t)
			if goSpare {
				sandbox.UseGoSpare(p)
			}
			cold := sandboxtest.StartSpec(t, p, config.SandboxSpec{})
			cu, ok := cold.(sandbox.UsageCounter).Usage()
			if !ok {
				t.Skipf("no cgroup here: %+v", cu)
			}
			warm := startClaimed(t, p)
			wu, _ := warm.(sandbox.UsageCounter).Usage()
			t.Logf("cold before any command: %+v; warm just claimed: %+v", cu, wu)
			if wu.CPUMillis != cu.CPUMillis || wu.PeakMemoryBytes != cu.PeakMemoryBytes {
				t.Errorf("a just-claimed warm sandbox counts cpu %d ms, peak memory %d bytes for its job; a cold one %d ms, %d bytes",
					wu.CPUMillis, wu.PeakMemoryBytes, cu.CPUMillis, cu.PeakMemoryBytes)
			}
			const hold = `x=$(head -c 30000000 /dev/zero | tr '\0' a); echo ${#x}`
			if res, err := warm.Exec(t.Context(), sandbox.ExecRequest{Argv: []string{"sh", "-c", hold}}); err != nil || res.ExitCode != 0 {
				t.Fatalf("exec: %v, exit %d: %s", err, res.ExitCode, res.Stderr)
			}
			if wu, _ = warm.(sandbox.UsageCounter).Usage(); wu.PeakMemoryBytes < 30_000_000 && !missing(wu, "memory") {
				t.Errorf("the warm sandbox's job held 30 MB; its usage counts a peak of %d bytes", wu.PeakMemoryBytes)
			}
		})
	}
}

// TestBubblewrapWarmProcessBudgetAsCold: the first command of a warm sandbox holds as many
// processes at once as that of a cold one, under the same bound: the spare's helper and its
// threads are gone once the command runs, and nothing else of the warm-up counts against the
// sandbox's uid or cgroup. (The fork bomb of the escape suite dies out sooner or later by
// chance: each of its shells exits when one of its two forks is refused.)
func TestBubblewrapWarmProcessBudgetAsCold(t *testing.T) {
	t.Parallel()
	// dash exits at the fork it cannot make; each pid started is in the workdir by then.
	const fill = `while :; do sleep 60 </dev/null >/dev/null 2>&1 & echo $! >> pids; done`
	held := func(t *testing.T, p sandbox.Provider) string {
		sb := sandboxtest.StartSpec(t, p, sandboxtest.EscapeSpec)
		res, err := sb.Exec(t.Context(), sandbox.ExecRequest{Argv: []string{"sh", "-c", fill}, Timeout: 30 * time.Second})
		if err != nil || res.TimedOut || !strings.Contains(string(res.Stderr), "fork") {
			t.Fatalf("filling the bound: %v, timed out %v, exit %d, stderr %q", err, res.TimedOut, res.ExitCode, res.Stderr)
		}
		b, err := sb.ReadFile(t.Context(), "pids", 4096)
		if err != nil {
			t.Fatal(err)
		}
		return strconv.Itoa(len(strings.Fields(string(b))))
	}
	cold := held(t, sandboxtest.Bubblewrap(t))
	for _, tt := range []struct {
		name string
		edit func(*sandbox.BubblewrapProvider)
	}{
		{"shell spare", func(*sandbox.BubblewrapProvider) {}},
		{"Go spare", sandbox.UseGoSpare},
	} {
		t.Run(tt.name, func(t *testing.T) {
			p := sandboxtest.Bubblewrap(t)
			tt.edit(p)
			if warm := held(t, sandboxtest.Warm(t, p)); warm != cold {
				t.Errorf("a warm sandbox's first command held %s processes beside its shell, a cold one's %s", warm, cold)
			}
		})
	}
	t.Logf("%s processes beside the command's shell, of a bound of %d", cold, sandboxtest.EscapeSpec.PIDs)
}
