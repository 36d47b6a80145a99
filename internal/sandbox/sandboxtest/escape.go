package sandboxtest

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/boxcar-run/boxcar/internal/config"
	"github.com/boxcar-run/boxcar/internal/sandbox"
	"github.com/boxcar-run/boxcar/test/harness"
)

// EscapeSpec bounds the sandboxes of the escape suite, small enough that every attack reaches
// its bound within seconds.
var EscapeSpec = config.SandboxSpec{Memory: "128Mi", PIDs: 32, Disk: "16Mi", CPU: "500m"}

// The disk bound of EscapeSpec and what a filesystem that enforces it may hold: a sixteenth
// above it, one inode per 4 KiB.
const (
	escapeDisk         = 16 << 20
	escapeDiskCeiling  = escapeDisk + escapeDisk/16
	escapeInodeCeiling = escapeDisk / 4096 * 17 / 16
	// The memory bound, the workdir's if it is a tmpfs charged to the same cgroup, and 8 MiB
	// for the shared libraries a process's resident set counts.
	escapeMemoryCeiling = 128<<20 + escapeDiskCeiling + 8<<20
)

// Host is how the escape suite judges a backend from the host side. The sandboxes must run on
// this machine (bubblewrap; a single-node test cluster), whose process table the suite reads.
type Host struct {
	// WorkdirUse reads, from the host, the bytes and inodes in use on the filesystem that
	// holds the sandbox's workdir. nil when the backend bounds disk by other means than the
	// kernel at write time (a pod's emptyDir: eviction); the disk cases then say so and skip.
	WorkdirUse func(sb sandbox.Sandbox) (bytes, inodes int64, err error)
	// PIDs is the number of processes one sandbox can hold: EscapeSpec.PIDs where the backend
	// enforces the spec, the node's pod limit otherwise; 0 when nothing bounds them, and the
	// fork bomb is skipped (it would take the machine's process table).
	PIDs int
	// SignalsQueued is how many pending signals and POSIX timers one sandbox may hold
	// together (its RLIMIT_SIGPENDING); 0 where the backend leaves them to the container
	// runtime's, and the case is skipped.
	SignalsQueued int
}

// RunEscape runs the escape and exhaustion suite: each attack in a sandbox of EscapeSpec, the
// result judged from the host, not from what the sandbox reports. The cases run one after
// another, so that each one's measurements are its own.
func RunEscape(t *testing.T, p sandbox.Provider, host Host) {
	tests := []struct {
		name string
		fn   func(t *testing.T, p sandbox.Provider, host Host)
	}{
		{"DiskUnlinkedOpenFiles", diskAttack(`exec 3>u3 4>u4 5>u5 6>u6 7>u7 8>u8; rm u*; for fd in 3 4 5 6 7 8; do eval "head -c 15000000 /dev/zero >&$fd"; done; sleep 5`, false)},
		{"DiskDepthPastPathMax", diskAttack(`n=$(printf 'd%.0s' $(seq 40)); for i in $(seq 300); do mkdir "$n" && cd -P "$n" || exit 1; done; for i in 1 2 3 4 5 6 7 8; do head -c 15000000 /dev/zero > f$i; done; sleep 5`, false)},
		{"DiskManyEmptyFiles", diskAttack(`i=0; while [ $i -lt 100000 ]; do : > e$i || break; i=$((i+1)); done; echo "made $i" >&2; sleep 5`, true)},
		{"TmpManyEmptyFiles", testTmpManyEmptyFiles},
		{"ForkBomb", testForkBomb},
		{"MemoryBomb", testMemoryBomb},
		{"CPUSpin", testCPUSpin},
		{"OutputFlood", testOutputFlood},
		{"SignalsQueued", testSignalsQueued},
		{"NothingOutlivesItsCommand", testOutlivesCommand},
		{"NothingOutlivesClose", testOutlivesClose},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) { tt.fn(t, p, host) })
	}
}

// StartSpec starts a sandbox of spec (unset fields at the profile defaults) for the test or
// benchmark and closes it when it ends.
func StartSpec(t testing.TB, p sandbox.Provider, spec config.SandboxSpec) sandbox.Sandbox {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	sb, err := p.Start(ctx, Spec("test-"+strings.ReplaceAll(t.Name(), "/", "-"), spec))
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

// Spec is the start spec of job id with s's unset fields at the profile defaults, as
// config.Load fills them: backends take complete specs only.
func Spec(id string, s config.SandboxSpec) sandbox.Spec {
	return sandbox.Spec{JobID: id, SandboxSpec: config.Profile{Sandbox: s}.WithDefaults().Sandbox}
}

func startEscape(t *testing.T, p sandbox.Provider) sandbox.Sandbox {
	return StartSpec(t, p, EscapeSpec)
}

// marker is a word no other process on the machine has in its environment: the suite gives it
// to the attack's command as BOXCAR_ESCAPE, which every process the command starts inherits,
// and finds the attack's processes in the host's process table by it.
func marker() string {
	var b [6]byte
	_, _ = rand.Read(b[:])
	return "boxcar-escape-" + hex.EncodeToString(b[:])
}

// attack runs script with the marker in its environment under timeout, and checks it ends
// within timeout + 10 s whatever it does.
func attack(t *testing.T, sb sandbox.Sandbox, mark, script string, timeout time.Duration, maxOut int) (sandbox.ExecResult, error) {
	t.Helper()
	begin := time.Now()
	res, err := sb.Exec(t.Context(), sandbox.ExecRequest{Argv: []string{"sh", "-c", script}, Env: markEnv(mark), Timeout: timeout, MaxOutputBytes: maxOut})
	// The promise is that an attack cannot hold Exec much past its timeout, not how fast the
	// kill is: when the kill inside a Kubernetes pod loses the race with a fork bomb on a busy
	// host, the backend kills from outside 2 s after the timeout, which may take up to 10 s
	// (killGrace).
	if took := time.Since(begin); took > timeout+attackSlack {
		t.Errorf("Exec returned after %v, want within the %v timeout + %v", took, timeout, attackSlack)
	}
	t.Logf("exit %d, timed out %v, err %v, %d bytes of stdout (truncated %v)", res.ExitCode, res.TimedOut, err, len(res.Stdout), res.StdoutTruncated)
	return res, err
}

// attackSlack is how long an attack may hold Exec past its timeout: the Kubernetes backend's
// outside kill, due 2 s after the timeout and given up to 10 s, and room for a loaded host.
const attackSlack = 20 * time.Second

func markEnv(mark string) map[string]string { return map[string]string{"BOXCAR_ESCAPE": mark} }

// hostProcs lists the host's processes whose environment holds mark, with their resident
// memory in bytes.
func hostProcs(mark string) map[int]int64 {
	out := map[int]int64{}
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		environ, err := os.ReadFile(filepath.Join("/proc", e.Name(), "environ"))
		if err != nil || !strings.Contains(string(environ), "BOXCAR_ESCAPE="+mark+"\x00") {
			continue
		}
		out[pid] = residentBytes(pid)
	}
	return out
}

func residentBytes(pid int) int64 {
	status, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "status"))
	if err != nil {
		return 0
	}
	for line := range strings.SplitSeq(string(status), "\n") {
		if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			kb, _ := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			return kb << 10
		}
	}
	return 0
}

// sampler reads a host-side measure every few milliseconds until stopped and keeps its peak.
type sampler struct {
	stop chan struct{}
	done chan struct{}
	mu   sync.Mutex
	peak []int64
}

func sample(read func() []int64) *sampler {
	s := &sampler{stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(s.done)
		tick := time.NewTicker(10 * time.Millisecond)
		defer tick.Stop()
		for {
			v := read()
			s.mu.Lock()
			if s.peak == nil {
				s.peak = make([]int64, len(v))
			}
			for i := range v {
				s.peak[i] = max(s.peak[i], v[i])
			}
			s.mu.Unlock()
			select {
			case <-s.stop:
				return
			case <-tick.C:
			}
		}
	}()
	return s
}

// end stops the sampler and returns the peaks.
func (s *sampler) end() []int64 {
	close(s.stop)
	<-s.done
	return s.peak
}

// expectNoneLeft waits until no host process holds mark, and fails naming them if some still
// do after within.
func expectNoneLeft(t *testing.T, mark string, within time.Duration) {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		left := hostProcs(mark)
		if len(left) == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Errorf("%d processes of the attack still run on the host %v after it ended", len(left), within)
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// ExpectHostForks checks that the host can still start a process: one starts (a host whose
// process table an attack filled refuses the fork, which fails the test at once) and runs to
// its end, printing what it was told to. How long that takes is no check, as a busy machine is
// slow to schedule it: the wait grows with the load (harness.Poll), and fails only a host that
// never runs it.
func ExpectHostForks(t testing.TB) {
	t.Helper()
	var out bytes.Buffer
	cmd := exec.Command("sh", "-c", "echo forked")
	cmd.Stdout = &out
	if err := cmd.Start(); err != nil {
		t.Errorf("the host cannot start a process: %v", err)
		return
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	var err error
	// Poll, not Wait: a caller may have an attack's goroutine that reports after this.
	if perr := harness.Poll(t.Context(), 30*time.Second, "a process the host started to end", func(context.Context) (bool, error) {
		select {
		case err = <-exited:
			return true, nil
		default:
			return false, errors.New("it still runs")
		}
	}); perr != nil {
		_ = cmd.Process.Kill()
		t.Errorf("the host started a process that never ran to its end: %v", perr)
		return
	}
	if err != nil || out.String() != "forked\n" {
		t.Errorf("the host's process ended with %v and printed %q, want forked", err, out.String())
	}
}

// diskAttack fills the workdir against its bound: bytes, or inodes when onInodes. The host's
// view of the filesystem under the workdir must stay within the ceiling throughout.
func diskAttack(script string, onInodes bool) func(t *testing.T, p sandbox.Provider, host Host) {
	return func(t *testing.T, p sandbox.Provider, host Host) {
		if host.WorkdirUse == nil {
			t.Skip("this backend bounds the workdir by eviction, not at write time (docs/sandbox.md)")
		}
		sb := startEscape(t, p)
		use := func() []int64 {
			b, i, err := host.WorkdirUse(sb)
			if err != nil {
				return nil
			}
			return []int64{b, i}
		}
		s := sample(use)
		_, err := attack(t, sb, marker(), script, 60*time.Second, 4096)
		peak := s.end()
		if len(peak) != 2 {
			t.Fatal("the host could not read the workdir's filesystem")
		}
		t.Logf("peak on the host: %d bytes (bound %d, ceiling %d), %d inodes (ceiling %d)", peak[0], escapeDisk, escapeDiskCeiling, peak[1], escapeInodeCeiling)
		if !errors.Is(err, sandbox.ErrDiskFull) {
			t.Errorf("err = %v, want ErrDiskFull", err)
		}
		if !onInodes && peak[0] > escapeDiskCeiling {
			t.Errorf("the workdir's filesystem held %d bytes at its peak, over the %d-byte ceiling of a %d-byte bound", peak[0], escapeDiskCeiling, escapeDisk)
		}
		if onInodes && peak[1] > escapeInodeCeiling {
			t.Errorf("the workdir's filesystem held %d inodes at its peak, over the ceiling of %d", peak[1], escapeInodeCeiling)
		}
	}
}

// testTmpManyEmptyFiles makes empty files in /tmp until refused (up to 100 000; true, not the
// special builtin :, whose failed redirection would end the shell): they use no
// pages, so a tmpfs's size does not stop them, and each is an inode of the host's kernel memory.
// The host reads the attack's /tmp (statfs through /proc/PID/root) throughout: it holds at most
// the disk bound's inodes and a sixteenth, and the attack is refused or killed (ErrDiskFull).
func testTmpManyEmptyFiles(t *testing.T, p sandbox.Provider, host Host) {
	if host.WorkdirUse == nil {
		t.Skip("this backend bounds /tmp by eviction, not at write time (docs/sandbox.md)")
	}
	sb := startEscape(t, p)
	mark := marker()
	s := sample(func() []int64 {
		var most int64
		for pid := range hostProcs(mark) {
			var st unix.Statfs_t
			if unix.Statfs(filepath.Join("/proc", strconv.Itoa(pid), "root", "tmp"), &st) == nil {
				most = max(most, int64(st.Files-st.Ffree))
			}
		}
		return []int64{most}
	})
	res, err := attack(t, sb, mark, `cd /tmp || exit 1; i=0; while [ $i -lt 100000 ]; do true > e$i || break; i=$((i+1)); done; echo "made $i"`, 60*time.Second, 4096)
	peak := s.end()[0]
	t.Logf("peak: %d inodes in the attack's /tmp on the host (ceiling %d); %s", peak, escapeInodeCeiling, strings.TrimSpace(string(res.Stdout)))
	if peak > escapeInodeCeiling {
		t.Errorf("the attack's /tmp held %d inodes at its peak, over the ceiling of %d", peak, escapeInodeCeiling)
	}
	if err == nil && strings.TrimSpace(string(res.Stdout)) == "made 100000" {
		t.Errorf("the attack made 100 000 empty files in /tmp: nothing refused them")
	} else if err != nil && !errors.Is(err, sandbox.ErrDiskFull) {
		t.Errorf("err = %v, want nil (refused by the kernel) or ErrDiskFull", err)
	}
	ExpectHostForks(t)
}

// testForkBomb forks without end: the host's process table holds at most the bound's worth of
// the bomb's processes, the host keeps forking, and nothing of it survives.
func testForkBomb(t *testing.T, p sandbox.Provider, host Host) {
	if host.PIDs == 0 {
		t.Skip("nothing bounds a sandbox's processes on this backend here; a fork bomb would take the machine's process table")
	}
	sb := startEscape(t, p)
	mark := marker()
	s := sample(func() []int64 { return []int64{int64(len(hostProcs(mark)))} })
	done := make(chan struct{})
	var res sandbox.ExecResult
	go func() {
		defer close(done)
		// exec, not a fork: once the bomb fills the bound, a forked sleep would fail and end
		// the whole attempt before a busy host had sampled it.
		var err error
		res, err = attack(t, sb, mark, `f() { f | f & }; f; exec sleep 100`, 10*time.Second, 4096)
		if err != nil || (!res.TimedOut && res.ExitCode == 0) {
			t.Errorf("fork bomb: err %v, exit %d; want it stopped by the timeout or the process bound", err, res.ExitCode)
		}
	}()
	// The bomb may burn out before a look sees it: each of its shells needs two forks and exits
	// when the bound refuses one, so against a bound of 32 (the sleep's two unreaped children
	// and exited shells not yet reaped among them) it can die out within a fraction of a second,
	// leaving only the sleep. The wait then ends with the attack, and the shell's "Cannot fork"
	// shows that the bomb ran into its bound.
	seen := false
	waitFor(t, 30*time.Second, "the bomb to start", func() bool {
		seen = seen || len(hostProcs(mark)) > 1
		select {
		case <-done:
			return true
		default:
			return seen
		}
	})
	ExpectHostForks(t)
	<-done
	if !seen && !strings.Contains(strings.ToLower(string(res.Stderr)), "fork") {
		t.Errorf("the host never saw the bomb fork, nor did its shell say that a fork failed: stderr %q", res.Stderr)
	}
	peak := s.end()[0]
	t.Logf("peak: %d of the bomb's processes on the host, bound %d", peak, host.PIDs)
	if peak > int64(host.PIDs) {
		t.Errorf("the host held %d of the bomb's processes at once, over the bound of %d", peak, host.PIDs)
	}
	expectNoneLeft(t, mark, 30*time.Second)
}

// testMemoryBomb grows a string without end: the host sees its processes hold at most the
// memory bound, and the bound ends it long before the timeout.
func testMemoryBomb(t *testing.T, p sandbox.Provider, _ Host) {
	sb := startEscape(t, p)
	mark := marker()
	s := sample(func() []int64 {
		var sum int64
		for _, rss := range hostProcs(mark) {
			sum += rss
		}
		return []int64{sum}
	})
	res, err := attack(t, sb, mark, `a=xxxxxxxxxxxxxxxx; while :; do a="$a$a"; done`, 60*time.Second, 4096)
	peak := s.end()[0]
	t.Logf("peak resident memory of the bomb on the host: %d bytes, bound %d", peak, 128<<20)
	if err != nil || res.TimedOut || res.ExitCode == 0 {
		t.Errorf("memory bomb: err %v, timed out %v, exit %d; want it ended by the bound with a non-zero exit", err, res.TimedOut, res.ExitCode)
	}
	if peak > escapeMemoryCeiling {
		t.Errorf("the bomb held %d bytes resident on the host, over the %d-byte bound and its slack", peak, escapeMemoryCeiling)
	}
	expectNoneLeft(t, mark, 15*time.Second)
}

// testCPUSpin spins several processes past the timeout: they are gone from the host on time,
// and the host keeps running meanwhile.
func testCPUSpin(t *testing.T, p sandbox.Provider, _ Host) {
	sb := startEscape(t, p)
	mark := marker()
	done := make(chan struct{})
	go func() {
		defer close(done)
		res, err := attack(t, sb, mark, `for i in 1 2 3 4; do (while :; do :; done) & done; while :; do :; done`, 3*time.Second, 4096)
		if err != nil || !res.TimedOut {
			t.Errorf("CPU spin: err %v, timed out %v; want a timed-out result", err, res.TimedOut)
		}
	}()
	waitFor(t, 10*time.Second, "the spinners to start", func() bool { return len(hostProcs(mark)) >= 4 })
	ExpectHostForks(t)
	<-done
	expectNoneLeft(t, mark, 15*time.Second)
}

// testOutputFlood writes without end to both streams: the result holds at most the cap, the
// command is stopped at its timeout, and nothing of it runs on.
func testOutputFlood(t *testing.T, p sandbox.Provider, _ Host) {
	sb := startEscape(t, p)
	mark := marker()
	const maxOut = 64 << 10
	res, err := attack(t, sb, mark, `(while :; do echo flood-flood-flood-flood >&2; done) & while :; do echo flood-flood-flood-flood; done`, 3*time.Second, maxOut)
	if err != nil {
		t.Fatalf("output flood: %v", err)
	}
	if len(res.Stdout) > maxOut || len(res.Stderr) > maxOut || !res.StdoutTruncated || !res.StderrTruncated {
		t.Errorf("output flood: %d and %d bytes back (truncated %v, %v), want at most %d each and both marked truncated",
			len(res.Stdout), len(res.Stderr), res.StdoutTruncated, res.StderrTruncated, maxOut)
	}
	if !res.TimedOut {
		t.Errorf("output flood: not timed out; an endless writer must be stopped at its timeout")
	}
	expectNoneLeft(t, mark, 15*time.Second)
}

// testOutlivesCommand leaves processes behind as its command exits, each trying another way to
// survive: background, setsid, ignoring the hang-up and termination signals.
func testOutlivesCommand(t *testing.T, p sandbox.Provider, _ Host) {
	sb := startEscape(t, p)
	mark := marker()
	res, err := attack(t, sb, mark, `sleep 1000 & setsid sleep 1001 & (trap '' HUP TERM; sleep 1002) & nohup sleep 1003 >/dev/null 2>&1 & echo left`, 30*time.Second, 4096)
	if err != nil || res.ExitCode != 0 {
		t.Fatalf("the command: err %v, exit %d, stderr %q", err, res.ExitCode, res.Stderr)
	}
	expectNoneLeft(t, mark, 15*time.Second)
}

// testOutlivesClose closes the sandbox while a command that ignores signals runs: nothing of
// it is left on the host.
func testOutlivesClose(t *testing.T, p sandbox.Provider, _ Host) {
	sb := startEscape(t, p)
	mark := marker()
	ctx := context.WithoutCancel(t.Context())
	done := make(chan struct{})
	go func() {
		defer close(done)
		_, _ = sb.Exec(ctx, sandbox.ExecRequest{Argv: []string{"sh", "-c", "trap '' HUP TERM INT; (trap '' HUP TERM; sleep 1000) & setsid sleep 1001 & echo > started; sleep 1002"}, Env: markEnv(mark)})
	}()
	waitFor(t, 30*time.Second, "the command to start", func() bool {
		_, err := sb.ReadFile(ctx, "started", 10)
		return err == nil
	})
	if err := sb.Close(ctx); err != nil {
		t.Fatalf("Close: %v", err)
	}
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		t.Error("Exec still running 30s after Close")
	}
	expectNoneLeft(t, mark, 30*time.Second)
}
