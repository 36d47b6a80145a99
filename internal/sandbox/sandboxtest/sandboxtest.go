// Package sandboxtest is the conformance suite every sandbox backend passes: exit codes, stdin,
// stdout/stderr separation, output caps, timeouts that kill the whole process tree, binary-safe
// file round trips, path confinement, streaming reads (Open: caps, no symlink followed),
// listing (ErrNotDir for a file), concurrency and idempotent Close. It uses only commands a minimal image has (sh, cat, echo, sleep, ln, head),
// with busybox-compatible flags.
package sandboxtest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/boxcar-run/boxcar/internal/config"
	"github.com/boxcar-run/boxcar/internal/sandbox"
	"github.com/boxcar-run/boxcar/test/harness"
)

// Run runs the suite against the backend that newProvider makes. newProvider is called once per
// subtest and should fail the test (not skip it) when the backend is unavailable.
func Run(t *testing.T, newProvider func(t *testing.T) sandbox.Provider) {
	tests := []suiteTest{
		{"ExitCodes", testExitCodes},
		{"Stdin", testStdin},
		{"StdoutStderr", testStdoutStderr},
		{"EnvAndDir", testEnvAndDir},
		{"OutputCaps", testOutputCaps},
		{"TimeoutKillsTree", testTimeoutKillsTree},
		{"ContextCancelKills", testContextCancelKills},
		{"FileRoundTrip", testFileRoundTrip},
		{"PathConfinement", testPathConfinement},
		{"SymlinkEscape", testSymlinkEscape},
		{"List", testList},
		{"Close", testClose},
		{"CloseKillsRunning", testCloseKillsRunning},
		{"ConcurrentExec", testConcurrentExec},
		{"Info", testInfo},
	}
	tests = append(tests, openCases...)
	tests = append(tests, writeCases...)
	tests = append(tests, errnoCases...)
	for _, tt := range append(tests, hostileShapes...) {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			tt.fn(t, newProvider(t))
		})
	}
}

type suiteTest struct {
	name string
	fn   func(t *testing.T, p sandbox.Provider)
}

// Start starts a sandbox for the test and closes it when the test ends.
func Start(t *testing.T, p sandbox.Provider) sandbox.Sandbox {
	t.Helper()
	return StartSpec(t, p, config.SandboxSpec{})
}

// Exec runs a request that must not fail as an operation.
func Exec(t *testing.T, sb sandbox.Sandbox, req sandbox.ExecRequest) sandbox.ExecResult {
	t.Helper()
	res, err := sb.Exec(t.Context(), req)
	if err != nil {
		t.Fatalf("Exec %q: %v", req.Argv, err)
	}
	return res
}

// Sh runs a shell script and requires exit code 0.
func Sh(t *testing.T, sb sandbox.Sandbox, script string) sandbox.ExecResult {
	t.Helper()
	res := Exec(t, sb, sandbox.ExecRequest{Argv: []string{"sh", "-c", script}, Timeout: 30 * time.Second})
	if res.ExitCode != 0 {
		t.Fatalf("sh -c %q: exit %d, stderr %q", script, res.ExitCode, res.Stderr)
	}
	return res
}

func testExitCodes(t *testing.T, p sandbox.Provider) {
	sb := Start(t, p)
	tests := []struct {
		name       string
		argv       []string
		want       int
		wantStderr bool
	}{
		{name: "success", argv: []string{"true"}, want: 0},
		{name: "exit 3", argv: []string{"sh", "-c", "exit 3"}, want: 3},
		{name: "exit 1", argv: []string{"sh", "-c", "exit 1"}, want: 1},
		{name: "missing binary", argv: []string{"boxcar-no-such-command"}, want: 127, wantStderr: true},
		{name: "missing absolute binary", argv: []string{"/nonexistent/cmd"}, want: 127, wantStderr: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			res := Exec(t, sb, sandbox.ExecRequest{Argv: tt.argv, Timeout: 30 * time.Second})
			if res.ExitCode != tt.want {
				t.Errorf("exit code = %d, want %d (stderr %q)", res.ExitCode, tt.want, res.Stderr)
			}
			if tt.wantStderr && len(res.Stderr) == 0 {
				t.Errorf("stderr is empty, want an explanation")
			}
			if res.TimedOut {
				t.Errorf("TimedOut = true, want false")
			}
		})
	}
}

func testStdin(t *testing.T, p sandbox.Provider) {
	sb := Start(t, p)
	tests := []struct {
		name  string
		stdin []byte
	}{
		{name: "text", stdin: []byte("hello\nworld\n")},
		{name: "binary", stdin: allBytes()},
		{name: "large", stdin: bytes.Repeat([]byte("0123456789abcdef"), 64<<10)}, // 1 MiB, beyond a pipe buffer
		{name: "nil", stdin: nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			res := Exec(t, sb, sandbox.ExecRequest{Argv: []string{"cat"}, Stdin: tt.stdin, Timeout: 30 * time.Second, MaxOutputBytes: 2 << 20})
			if res.ExitCode != 0 || !bytes.Equal(res.Stdout, tt.stdin) {
				t.Errorf("cat: exit %d, %d bytes back, want exit 0 and the %d bytes sent", res.ExitCode, len(res.Stdout), len(tt.stdin))
			}
		})
	}
}

func testStdoutStderr(t *testing.T, p sandbox.Provider) {
	sb := Start(t, p)
	res := Sh(t, sb, "echo out; echo err >&2; echo out2")
	if got := string(res.Stdout); got != "out\nout2\n" {
		t.Errorf("stdout = %q, want %q", got, "out\nout2\n")
	}
	if got := string(res.Stderr); got != "err\n" {
		t.Errorf("stderr = %q, want %q", got, "err\n")
	}
}

func testEnvAndDir(t *testing.T, p sandbox.Provider) {
	sb := Start(t, p)
	if err := sb.WriteFile(t.Context(), "sub/dir/x.txt", []byte("in sub")); err != nil {
		t.Fatal(err)
	}
	res := Exec(t, sb, sandbox.ExecRequest{
		Argv: []string{"sh", "-c", `printf '%s|' "$FOO" "$EMPTY"; cat x.txt`},
		Env:  map[string]string{"FOO": "bar baz", "EMPTY": ""},
		Dir:  "sub/dir",
	})
	if got, want := string(res.Stdout), "bar baz||in sub"; got != want {
		t.Errorf("stdout = %q, want %q", got, want)
	}
	for _, dir := range []string{"../", "/etc", "sub/../.."} {
		if _, err := sb.Exec(t.Context(), sandbox.ExecRequest{Argv: []string{"true"}, Dir: dir}); !errors.Is(err, sandbox.ErrPathEscape) {
			t.Errorf("Exec with Dir %q: err = %v, want ErrPathEscape", dir, err)
		}
	}
	if _, err := sb.Exec(t.Context(), sandbox.ExecRequest{Argv: []string{"true"}, Dir: "missing"}); !errors.Is(err, sandbox.ErrNotFound) {
		t.Errorf("Exec with a missing Dir: err = %v, want ErrNotFound", err)
	}
}

func testOutputCaps(t *testing.T, p sandbox.Provider) {
	sb := Start(t, p)
	tests := []struct {
		name          string
		script        string
		cap           int
		wantOut       int
		wantErr       int
		truncOut, tru bool
	}{
		{name: "both over the cap", script: "head -c 1048576 /dev/zero; head -c 1048576 /dev/zero >&2", cap: 1024, wantOut: 1024, wantErr: 1024, truncOut: true, tru: true},
		{name: "stdout over the cap", script: "head -c 1048576 /dev/zero; echo small >&2", cap: 1024, wantOut: 1024, wantErr: 6, truncOut: true},
		{name: "exactly the cap", script: "head -c 1024 /dev/zero", cap: 1024, wantOut: 1024},
		{name: "default cap", script: "head -c 1048577 /dev/zero", cap: 0, wantOut: sandbox.DefaultMaxOutputBytes, truncOut: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			res := Exec(t, sb, sandbox.ExecRequest{Argv: []string{"sh", "-c", tt.script}, MaxOutputBytes: tt.cap, Timeout: 30 * time.Second})
			if res.ExitCode != 0 {
				t.Errorf("exit code = %d, want 0: a capped command must run to its end", res.ExitCode)
			}
			if len(res.Stdout) != tt.wantOut || res.StdoutTruncated != tt.truncOut {
				t.Errorf("stdout: %d bytes, truncated %v; want %d, %v", len(res.Stdout), res.StdoutTruncated, tt.wantOut, tt.truncOut)
			}
			if len(res.Stderr) != tt.wantErr || res.StderrTruncated != tt.tru {
				t.Errorf("stderr: %d bytes, truncated %v; want %d, %v", len(res.Stderr), res.StderrTruncated, tt.wantErr, tt.tru)
			}
		})
	}
}

// lateScript starts children that, unless killed, append a line to a marker file five times a
// second, plus sleepers that would hold the command for 100 s.
const lateScript = `(while :; do echo late >> late1.txt; sleep 0.2; done) & (while :; do echo late >> late2.txt; sleep 0.2; done) & sleep 100 & sleep 100 & wait`

// killBound is how long a killed command may take to return: far less than the 100 s it would
// run, and far more than a busy machine needs to kill it.
const killBound = 30 * time.Second

// paceScript appends to pace.txt as lateScript's children append to their markers, ten times:
// the two seconds it runs are the sandbox's own, slower on a busy machine as a survivor would be.
const paceScript = `i=0; while [ $i -lt 10 ]; do echo pace >> pace.txt; sleep 0.2; i=$((i+1)); done`

// expectNoLateWrites fails if a marker of lateScript grew while paceScript ran in the sandbox
// after the command returned: then a child survived the kill. One more line is allowed, a write
// already under way when the kill came; a survivor, at paceScript's pace, adds ten.
func expectNoLateWrites(t *testing.T, sb sandbox.Sandbox) {
	t.Helper()
	size := func(name string) int {
		data, err := sb.ReadFile(t.Context(), name, 1<<20)
		if err != nil && !errors.Is(err, sandbox.ErrNotFound) {
			t.Fatalf("ReadFile %s after the kill: %v", name, err)
		}
		return len(data)
	}
	names := []string{"late1.txt", "late2.txt"}
	first := map[string]int{}
	for _, name := range names {
		first[name] = size(name)
	}
	Sh(t, sb, paceScript)
	for _, name := range names {
		if grown := size(name) - first[name]; grown > len("late\n") {
			t.Fatalf("%s grew by %d bytes after the kill; a child survived and kept writing", name, grown)
		}
	}
}

func testTimeoutKillsTree(t *testing.T, p sandbox.Provider) {
	sb := Start(t, p)
	start := time.Now()
	res := Exec(t, sb, sandbox.ExecRequest{Argv: []string{"sh", "-c", lateScript}, Timeout: 300 * time.Millisecond})
	elapsed := time.Since(start)
	if !res.TimedOut {
		t.Errorf("TimedOut = false, want true (exit %d)", res.ExitCode)
	}
	if elapsed > killBound {
		t.Errorf("Exec returned after %v, want the command killed at its 300ms timeout, long before the 100 s it runs", elapsed)
	}
	if res.Duration <= 0 || res.Duration > elapsed {
		t.Errorf("Duration = %v, want within (0, %v]", res.Duration, elapsed)
	}
	expectNoLateWrites(t, sb)
	// The sandbox still works after a kill.
	if got := Sh(t, sb, "echo alive").Stdout; string(got) != "alive\n" {
		t.Errorf("after a timeout: stdout %q, want alive", got)
	}
}

func testContextCancelKills(t *testing.T, p sandbox.Provider) {
	sb := Start(t, p)
	ctx, cancel := context.WithTimeout(t.Context(), 300*time.Millisecond)
	defer cancel()
	start := time.Now()
	_, err := sb.Exec(ctx, sandbox.ExecRequest{Argv: []string{"sh", "-c", lateScript}})
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Exec with an expiring ctx: err = %v, want context.DeadlineExceeded", err)
	}
	if elapsed := time.Since(start); elapsed > killBound {
		t.Errorf("Exec returned after %v, want the command killed when its context ended, long before the 100 s it runs", elapsed)
	}
	expectNoLateWrites(t, sb)
}

func allBytes() []byte {
	b := make([]byte, 0, 256*3)
	for range 3 {
		for i := range 256 {
			b = append(b, byte(i))
		}
	}
	return b
}

func testFileRoundTrip(t *testing.T, p sandbox.Provider) {
	sb := Start(t, p)
	ctx := t.Context()
	data := allBytes()
	tests := []struct {
		name, path string
		data       []byte
	}{
		{name: "top level", path: "bytes.bin", data: data},
		{name: "nested new folders", path: "a/b/c/bytes.bin", data: data},
		{name: "empty", path: "empty", data: []byte{}},
		{name: "odd name", path: "with space/ünï.txt", data: []byte("x")},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if err := sb.WriteFile(ctx, tt.path, tt.data); err != nil {
				t.Fatalf("WriteFile: %v", err)
			}
			got, err := sb.ReadFile(ctx, tt.path, int64(len(tt.data)))
			if err != nil || !bytes.Equal(got, tt.data) {
				t.Fatalf("ReadFile: %d bytes, err %v; want the %d bytes written", len(got), err, len(tt.data))
			}
			// Commands see what the worker wrote, byte for byte.
			res := Exec(t, sb, sandbox.ExecRequest{Argv: []string{"cat", tt.path}, MaxOutputBytes: 1 << 20})
			if !bytes.Equal(res.Stdout, tt.data) {
				t.Errorf("cat %s inside: %d bytes, want %d", tt.path, len(res.Stdout), len(tt.data))
			}
		})
	}

	t.Run("written by a command", func(t *testing.T) {
		Sh(t, sb, "printf 'from inside' > inside.txt")
		got, err := sb.ReadFile(ctx, "inside.txt", 100)
		if err != nil || string(got) != "from inside" {
			t.Fatalf("ReadFile = %q, %v; want \"from inside\"", got, err)
		}
		// and the worker can replace a file the sandbox made, and the sandbox can change it back.
		if err := sb.WriteFile(ctx, "inside.txt", []byte("replaced")); err != nil {
			t.Fatal(err)
		}
		Sh(t, sb, "test \"$(cat inside.txt)\" = replaced && echo again >> inside.txt && mkdir -p a/b/c/d")
	})
	t.Run("symlink at the name is replaced", func(t *testing.T) {
		// Writing through the link would put the file in the folder it names, which may lie
		// outside the workdir; the link itself is replaced, as rename(2) replaces it.
		Sh(t, sb, "mkdir -p linkdir && ln -s linkdir tolinkdir && ln -s /tmp totmp && ln -s missing-target dangling")
		for _, name := range []string{"tolinkdir", "totmp", "dangling"} {
			if err := sb.WriteFile(ctx, name, []byte("replaced "+name)); err != nil {
				t.Fatalf("WriteFile %s: %v", name, err)
			}
			if got, err := sb.ReadFile(ctx, name, 100); err != nil || string(got) != "replaced "+name {
				t.Errorf("ReadFile %s = %q, %v; want the file just written", name, got, err)
			}
		}
		if files, err := sb.List(ctx, "linkdir"); err != nil || len(files) != 0 {
			t.Errorf("List linkdir = %v, %v; want it empty: nothing was written through the link", files, err)
		}
		if _, err := sb.ReadFile(ctx, "missing-target", 100); !errors.Is(err, sandbox.ErrNotFound) {
			t.Errorf("ReadFile missing-target: err = %v; want ErrNotFound: nothing was written through the link", err)
		}
	})
	t.Run("overwrite shorter", func(t *testing.T) {
		if err := sb.WriteFile(ctx, "bytes.bin", []byte("short")); err != nil {
			t.Fatal(err)
		}
		if got, err := sb.ReadFile(ctx, "bytes.bin", 100); err != nil || string(got) != "short" {
			t.Errorf("ReadFile = %q, %v; want \"short\"", got, err)
		}
	})
	t.Run("too large", func(t *testing.T) {
		if err := sb.WriteFile(ctx, "ten.bin", make([]byte, 10)); err != nil {
			t.Fatal(err)
		}
		if _, err := sb.ReadFile(ctx, "ten.bin", 9); !errors.Is(err, sandbox.ErrTooLarge) {
			t.Errorf("ReadFile with maxBytes 9 of 10: err = %v, want ErrTooLarge", err)
		}
	})
	t.Run("not found", func(t *testing.T) {
		for _, name := range []string{"missing", "missing/deeper", "ten.bin/below-a-file"} {
			if _, err := sb.ReadFile(ctx, name, 100); !errors.Is(err, sandbox.ErrNotFound) {
				t.Errorf("ReadFile %s: err = %v, want ErrNotFound", name, err)
			}
		}
	})
	t.Run("folder is not a file", func(t *testing.T) {
		if _, err := sb.ReadFile(ctx, "a", 100); err == nil {
			t.Errorf("ReadFile of a folder: err = nil, want an error")
		}
		if err := sb.WriteFile(ctx, "a", []byte("x")); err == nil {
			t.Errorf("WriteFile over a folder: err = nil, want an error")
		}
	})
}

func testPathConfinement(t *testing.T, p sandbox.Provider) {
	sb := Start(t, p)
	ctx := t.Context()
	for _, name := range []string{"/etc/passwd", "../x", "a/../../x", "..", "./../x", "a/b/../../../etc/passwd"} {
		t.Run(name, func(t *testing.T) {
			if _, err := sb.ReadFile(ctx, name, 1<<20); !errors.Is(err, sandbox.ErrPathEscape) {
				t.Errorf("ReadFile: err = %v, want ErrPathEscape", err)
			}
			if err := sb.WriteFile(ctx, name, []byte("x")); !errors.Is(err, sandbox.ErrPathEscape) {
				t.Errorf("WriteFile: err = %v, want ErrPathEscape", err)
			}
			if _, err := sb.List(ctx, name); !errors.Is(err, sandbox.ErrPathEscape) {
				t.Errorf("List: err = %v, want ErrPathEscape", err)
			}
		})
	}
}

// testSymlinkEscape plants symlinks from inside the sandbox and checks that the worker's file
// operations neither read nor write host files through them.
func testSymlinkEscape(t *testing.T, p sandbox.Provider) {
	sb := Start(t, p)
	ctx := t.Context()
	host, err := os.ReadFile("/etc/passwd")
	if err != nil {
		t.Fatal(err)
	}
	hostDir := t.TempDir()
	victim := filepath.Join(hostDir, "victim")
	Sh(t, sb, fmt.Sprintf("ln -s /etc/passwd passwd && ln -s / rootdir && ln -s .. up && ln -s %s victim && ln -s %s hostdir && mkdir -p d && ln -s ../../.. d/up3",
		victim, hostDir))

	for _, name := range []string{"passwd", "rootdir/etc/passwd", "up/etc/passwd", "d/up3/etc/passwd"} {
		got, err := sb.ReadFile(ctx, name, 1<<20)
		if err == nil && bytes.Equal(got, host) {
			t.Errorf("ReadFile %s returned the host's /etc/passwd", name)
		}
		if err != nil && !errors.Is(err, sandbox.ErrPathEscape) && !errors.Is(err, sandbox.ErrNotFound) {
			t.Errorf("ReadFile %s: err = %v, want ErrPathEscape (or a sandbox-local file)", name, err)
		}
	}
	for _, name := range []string{"victim", "hostdir/new", "rootdir" + victim} {
		_ = sb.WriteFile(ctx, name, []byte("pwned"))
		if _, err := os.Stat(victim); err == nil {
			t.Fatalf("WriteFile %s created %s on the host", name, victim)
		}
		if _, err := os.Stat(filepath.Join(hostDir, "new")); err == nil {
			t.Fatalf("WriteFile %s created a file in %s on the host", name, hostDir)
		}
	}
	if files, err := sb.List(ctx, "."); err != nil {
		t.Errorf("List: %v", err)
	} else {
		for _, f := range files {
			if strings.Contains(f.Path, "etc/") {
				t.Errorf("List followed a symlink out: %s", f.Path)
			}
		}
	}
}

func testList(t *testing.T, p sandbox.Provider) {
	sb := Start(t, p)
	ctx := t.Context()
	for name, data := range map[string]string{"a.txt": "a", "d/b.txt": "bb", "d/e/c.txt": "ccc"} {
		if err := sb.WriteFile(ctx, name, []byte(data)); err != nil {
			t.Fatal(err)
		}
	}
	Sh(t, sb, "ln -s a.txt link.txt && ln -s d dlink && mkdir -p empty/dir")
	tests := []struct {
		name, dir string
		want      []string
	}{
		{name: "workdir", dir: ".", want: []string{"a.txt:1", "d/b.txt:2", "d/e/c.txt:3"}},
		{name: "empty dir name", dir: "", want: []string{"a.txt:1", "d/b.txt:2", "d/e/c.txt:3"}},
		{name: "subfolder", dir: "d", want: []string{"d/b.txt:2", "d/e/c.txt:3"}},
		{name: "empty folder", dir: "empty", want: nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			files, err := sb.List(ctx, tt.dir)
			if err != nil {
				t.Fatal(err)
			}
			var got []string
			for _, f := range files {
				got = append(got, f.Path+":"+strconv.FormatInt(f.Size, 10))
				if !f.Mode.IsRegular() {
					t.Errorf("%s: mode %v, want a regular file", f.Path, f.Mode)
				}
			}
			if !slices.Equal(got, tt.want) {
				t.Errorf("List(%q) = %v, want %v", tt.dir, got, tt.want)
			}
		})
	}
	errs := []struct {
		name, dir string
		want      error
	}{
		{name: "missing", dir: "missing", want: sandbox.ErrNotFound},
		{name: "a file", dir: "a.txt", want: sandbox.ErrNotDir},
		{name: "a symlink to a file", dir: "link.txt", want: sandbox.ErrNotDir},
		{name: "below a file", dir: "a.txt/below", want: sandbox.ErrNotFound},
		{name: "below a missing folder", dir: "missing/below", want: sandbox.ErrNotFound},
	}
	for _, tt := range errs {
		t.Run(tt.name, func(t *testing.T) {
			if _, err := sb.List(ctx, tt.dir); !errors.Is(err, tt.want) {
				t.Errorf("List(%q): err = %v, want %v", tt.dir, err, tt.want)
			}
		})
	}
}

func testClose(t *testing.T, p sandbox.Provider) {
	sb := Start(t, p)
	ctx := context.WithoutCancel(t.Context())
	Sh(t, sb, "mkdir -p ro/sub && echo x > ro/sub/f && chmod 0500 ro/sub && chmod 0500 ro")
	for i := range 3 {
		if err := sb.Close(ctx); err != nil {
			t.Fatalf("Close #%d: %v", i+1, err)
		}
	}
	if _, err := sb.Exec(ctx, sandbox.ExecRequest{Argv: []string{"true"}}); !errors.Is(err, sandbox.ErrClosed) {
		t.Errorf("Exec after Close: err = %v, want ErrClosed", err)
	}
	if err := sb.WriteFile(ctx, "x", nil); !errors.Is(err, sandbox.ErrClosed) {
		t.Errorf("WriteFile after Close: err = %v, want ErrClosed", err)
	}
	if _, err := sb.ReadFile(ctx, "x", 1); !errors.Is(err, sandbox.ErrClosed) {
		t.Errorf("ReadFile after Close: err = %v, want ErrClosed", err)
	}
	if _, err := sb.List(ctx, "."); !errors.Is(err, sandbox.ErrClosed) {
		t.Errorf("List after Close: err = %v, want ErrClosed", err)
	}
}

func testCloseKillsRunning(t *testing.T, p sandbox.Provider) {
	sb := Start(t, p)
	ctx := context.WithoutCancel(t.Context())
	done := make(chan error, 1)
	go func() {
		_, err := sb.Exec(ctx, sandbox.ExecRequest{Argv: []string{"sh", "-c", "echo > started; sleep 100"}})
		done <- err
	}()
	waitFor(t, 20*time.Second, "the command to start", func() bool {
		_, err := sb.ReadFile(ctx, "started", 10)
		return err == nil
	})
	start := time.Now()
	if err := sb.Close(ctx); err != nil {
		t.Fatalf("Close: %v", err)
	}
	select {
	case err := <-done:
		if !errors.Is(err, sandbox.ErrClosed) {
			t.Errorf("Exec interrupted by Close: err = %v, want ErrClosed", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Exec still running 10s after Close")
	}
	if elapsed := time.Since(start); elapsed > 5*time.Second {
		t.Errorf("Close took %v with a command running, want it killed at once", elapsed)
	}
}

func testConcurrentExec(t *testing.T, p sandbox.Provider) {
	sb := Start(t, p)
	const n = 8
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for i := range n {
		wg.Go(func() {
			res, err := sb.Exec(t.Context(), sandbox.ExecRequest{
				Argv:    []string{"sh", "-c", `echo "$0" > "f$0"; sleep 0.2; cat "f$0"`, strconv.Itoa(i)},
				Timeout: 60 * time.Second,
			})
			switch {
			case err != nil:
				errs <- fmt.Errorf("exec %d: %w", i, err)
			case res.ExitCode != 0 || string(res.Stdout) != strconv.Itoa(i)+"\n":
				errs <- fmt.Errorf("exec %d: exit %d, stdout %q, stderr %q", i, res.ExitCode, res.Stdout, res.Stderr)
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	files, err := sb.List(t.Context(), ".")
	if err != nil || len(files) != n {
		t.Errorf("List after %d concurrent writers: %d files, err %v", n, len(files), err)
	}
}

func testInfo(t *testing.T, p sandbox.Provider) {
	sb := Start(t, p)
	info := sb.Info()
	if info.Backend != p.Backend() || info.Backend == "" {
		t.Errorf("Info().Backend = %q, want %q", info.Backend, p.Backend())
	}
	if info.ID == "" || info.Isolation == "" {
		t.Errorf("Info() = %+v, want an ID and what isolation is in force", info)
	}
}

// waitFor is harness.Wait for a condition with nothing to report but whether it holds.
func waitFor(t *testing.T, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	harness.Wait(t, what, func() (bool, error) { return cond(), nil }, harness.Within(timeout))
}
