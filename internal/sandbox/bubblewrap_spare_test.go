//go:build integration

package sandbox_test

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/boxcar-run/boxcar/internal/config"
	"github.com/boxcar-run/boxcar/internal/sandbox"
	"github.com/boxcar-run/boxcar/internal/sandbox/sandboxtest"
)

// firstCommand is a first command to run on a cold sandbox and on a warm one, with files its
// host folder holds before it runs.
type firstCommand struct {
	name  string
	req   sandbox.ExecRequest
	files map[string]os.FileMode // name -> mode; content: firstCommandFile
	mkdir []string
	// noSpare: the warm sandbox's spare cannot take the command, which starts its own bwrap.
	noSpare bool
	// norm makes an output comparable where it must differ: pipe inode numbers, and the order
	// of the environment (docs/sandbox.md).
	norm func([]byte) []byte
}

const firstCommandFile = "echo from a script without a #! line\n"

// runFirst starts a sandbox (a pool's, warmed and claimed, when warm) and runs c as its first
// command; wantSpare says whether that command must have run on the spare.
func runFirst(t *testing.T, p *sandbox.BubblewrapProvider, c firstCommand, warm bool) sandbox.ExecResult {
	t.Helper()
	spec := sandboxtest.Spec("job-1", config.SandboxSpec{})
	if warm {
		spec.JobID, spec.Pool, spec.Ahead = "", "p", time.Hour
	}
	sb, err := p.Start(t.Context(), spec)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sb.Close(context.Background()) })
	dir := sandbox.BubblewrapHostState(sb).Dir
	for _, d := range c.mkdir {
		if err := os.MkdirAll(filepath.Join(dir, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	for name, mode := range c.files {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(firstCommandFile), mode); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(filepath.Join(dir, name), mode); err != nil {
			t.Fatal(err)
		}
	}
	if warm {
		sandbox.AwaitWarm(sb)
		if err := sb.(sandbox.Claimer).Claim(t.Context(), "default", "job-1"); err != nil {
			t.Fatal(err)
		}
	}
	req := c.req
	req.Timeout = 30 * time.Second
	res, err := sb.Exec(t.Context(), req)
	if err != nil {
		t.Fatalf("%s: exec: %v", c.name, err)
	}
	if warm && sandbox.RanOnSpare(sb) == c.noSpare {
		t.Fatalf("%s: the warm sandbox's first command ran on its spare: %v, want %v", c.name, !c.noSpare, c.noSpare)
	}
	if c.norm != nil {
		res.Stdout = c.norm(res.Stdout)
	}
	return res
}

// weird are argv and environment values a shell would take apart if they were not quoted.
var weird = []string{"", " ", "'", `'\''`, `"`, "$HOME", "${PATH}", "`id`", "$(id)", "a\nb", "\n", "x\r\ny", `\`, `\n`,
	"*", "?", "[a]", "~", "-", "--", "-e", "a b\tc", ";exit 7", "|", "&", "#", "!", "\xff\xfe non-UTF-8 \x80", "é", "=", "a=b",
	"%s", "eval", "'$nl'", "\"$nl\""}

func weirdEnv() map[string]string {
	env := map[string]string{}
	for i, v := range weird {
		env[fmt.Sprintf("W%02d", i)] = v
	}
	// Names a shell gives a meaning to.
	for _, k := range []string{"IFS", "PS1", "PS2", "PS4", "ENV", "CDPATH", "OLDPWD", "PPID", "LINENO", "HOME", "_", "MAIL", "MAILPATH", "TERM",
		"HISTSIZE", "SHLVL", "p", "d", "q", "w", "nl", "r", "fail", "why", "runs"} {
		env[k] = "job's " + k
	}
	env["OPTIND"] = "3"
	return env
}

// TestBubblewrapWarmFirstCommandExactlyAsCold: a warm sandbox's first command, run on its
// spare, gives exactly what the same first command of a cold sandbox gives: output, exit code
// and the launcher's errors (a command that cannot be executed, a folder that is gone), the
// environment byte for byte (PWD, which bwrap sets, included), the descriptors, signal
// dispositions, and the pids its own children get.
func TestBubblewrapWarmFirstCommandExactlyAsCold(t *testing.T) {
	t.Parallel()
	p := sandboxtest.Bubblewrap(t)
	tests := []firstCommand{
		{name: "environment as bwrap sets it", req: sandbox.ExecRequest{Argv: []string{"env"}, Env: map[string]string{"JOB": "x"}}, norm: sortLines},
		{name: "the job's own PWD", req: sandbox.ExecRequest{Argv: []string{"env"}, Env: map[string]string{"PWD": "/elsewhere"}, Dir: "sub"}, mkdir: []string{"sub"}, norm: sortLines},
		{name: "a request too long for the shell", req: sandbox.ExecRequest{Argv: []string{"sh", "-c", "echo ${#BIG}"}, Env: map[string]string{"BIG": strings.Repeat("x", 10<<10)}}, noSpare: true},
		{name: "OPTIND that dash refuses", req: sandbox.ExecRequest{Argv: []string{"env"}, Env: map[string]string{"OPTIND": "x"}}, noSpare: true, norm: sortLines},
		{name: "environ sorted, weird values and shell names", req: sandbox.ExecRequest{Argv: []string{"sh", "-c", "tr '\\0' '\\n' </proc/self/environ | LC_ALL=C sort"}, Env: weirdEnv()}},
		{name: "argv through the shell", req: sandbox.ExecRequest{Argv: append([]string{"printf", "[%s]\\n"}, weird...)}},
		{name: "argv0 with quotes", req: sandbox.ExecRequest{Argv: []string{"./it's \"$x\"`", "a"}}, files: map[string]os.FileMode{"it's \"$x\"`": 0o755}},
		{name: "descriptors", req: sandbox.ExecRequest{Argv: []string{"find", "/proc/self/fd/", "-mindepth", "1", "-printf", "%f %l\\n"}}, norm: pipeNumbers},
		{name: "signals and session", req: sandbox.ExecRequest{Argv: []string{"grep", "-E", "^(Sig|Shd|NSpid|NSsid|NSpgid|Umask|NoNewPrivs|Seccomp|Cap)", "/proc/self/status"}}},
		{name: "the command's children's pids", req: sandbox.ExecRequest{Argv: []string{"sh", "-c", "echo $$ $(sh -c 'echo $$') $(sh -c 'echo $$')"}}},
		{name: "stdin without input", req: sandbox.ExecRequest{Argv: []string{"sh", "-c", "readlink /proc/self/fd/0; cat"}}},
		{name: "stdin with input", req: sandbox.ExecRequest{Argv: []string{"sh", "-c", "readlink /proc/self/fd/0 | cut -d: -f1; cat"}, Stdin: []byte("the input\n")}},
		{name: "folder", req: sandbox.ExecRequest{Argv: []string{"sh", "-c", "pwd; pwd -P; echo $PWD $OLDPWD"}, Dir: "sub dir/'x'"}, mkdir: []string{"sub dir/'x'"}},
		{name: "not found", req: sandbox.ExecRequest{Argv: []string{"no-such-command"}}},
		{name: "not found, own PATH", req: sandbox.ExecRequest{Argv: []string{"date"}, Env: map[string]string{"PATH": "/nowhere::/also/not"}}},
		{name: "found on an empty PATH entry", req: sandbox.ExecRequest{Argv: []string{"script"}, Env: map[string]string{"PATH": "/nowhere:"}}, files: map[string]os.FileMode{"script": 0o755}},
		{name: "not executable", req: sandbox.ExecRequest{Argv: []string{"./data"}}, files: map[string]os.FileMode{"data": 0o644}},
		{name: "a folder", req: sandbox.ExecRequest{Argv: []string{"./sub"}}, mkdir: []string{"sub"}},
		{name: "not a folder on the way", req: sandbox.ExecRequest{Argv: []string{"./data/x"}}, files: map[string]os.FileMode{"data": 0o644}},
		{name: "not executable on PATH", req: sandbox.ExecRequest{Argv: []string{"data"}, Env: map[string]string{"PATH": "/work:/usr/bin"}}, files: map[string]os.FileMode{"data": 0o644}},
		{name: "script without #!", req: sandbox.ExecRequest{Argv: []string{"./script", "arg"}}, files: map[string]os.FileMode{"script": 0o755}},
		{name: "exit status 1 with bwrap's words", req: sandbox.ExecRequest{Argv: []string{"sh", "-c", "echo 'bwrap: execvp x: No such file or directory' >&2; exit 1"}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			cold, warm := runFirst(t, p, tt, false), runFirst(t, p, tt, true)
			if cold.ExitCode != warm.ExitCode || !bytes.Equal(cold.Stdout, warm.Stdout) || !bytes.Equal(cold.Stderr, warm.Stderr) {
				t.Errorf("the warm sandbox's first command gave exit %d\nstdout %q\nstderr %q\nthe cold one's exit %d\nstdout %q\nstderr %q",
					warm.ExitCode, warm.Stdout, warm.Stderr, cold.ExitCode, cold.Stdout, cold.Stderr)
			}
		})
	}
}

func sortLines(b []byte) []byte {
	lines := bytes.SplitAfter(b, []byte("\n"))
	slices.SortFunc(lines, bytes.Compare)
	return bytes.Join(lines, nil)
}

var pipeInode = regexp.MustCompile(`:\[[0-9]+\]`)

func pipeNumbers(b []byte) []byte { return pipeInode.ReplaceAll(b, nil) }

// TestBubblewrapGoSpareEnvironmentAsCold: the Go spare, which sandboxes on an image's root
// keep, sets the environment a cold bwrap sets too, PWD included.
func TestBubblewrapGoSpareEnvironmentAsCold(t *testing.T) {
	t.Parallel()
	p := sandboxtest.Bubblewrap(t)
	sandbox.UseGoSpare(p)
	c := firstCommand{name: "environment", req: sandbox.ExecRequest{Argv: []string{"env"}, Env: map[string]string{"JOB": "x"}, Dir: "sub"},
		mkdir: []string{"sub"}, norm: sortLines}
	cold, warm := runFirst(t, p, c, false), runFirst(t, p, c, true)
	if !bytes.Equal(cold.Stdout, warm.Stdout) {
		t.Errorf("the warm sandbox's first command saw\n%s\nthe cold one's\n%s", warm.Stdout, cold.Stdout)
	}
}

// TestBubblewrapWorkersInheritedDescriptorsStayOut: a descriptor the worker inherited from
// whatever started it (a shell, a supervisor, a CI runner's pipe), open across exec, reaches no
// command of a sandbox, cold, warm on the shell spare or on the Go spare. Go closes at exec only
// the descriptors it opened itself, and bwrap passes what it does not use on to the command: a
// worker started from a shell with a pipe at fd 251 handed that pipe to every first command.
func TestBubblewrapWorkersInheritedDescriptorsStayOut(t *testing.T) {
	// Above the descriptors the worker hands bwrap, which take the low numbers over in the
	// child, as a pipe at 251 was above them.
	var pipe [2]int
	if err := unix.Pipe2(pipe[:], unix.O_CLOEXEC); err != nil {
		t.Fatal(err)
	}
	inherited := []int{240, 241}
	for i, fd := range inherited {
		if _, err := unix.FcntlInt(uintptr(fd), unix.F_GETFD, 0); err == nil {
			t.Fatalf("fd %d is open already", fd)
		}
		if err := unix.Dup2(pipe[i], fd); err != nil { // as inherited: not close-on-exec
			t.Fatal(err)
		}
	}
	t.Cleanup(func() {
		for _, fd := range append(inherited, pipe[:]...) {
			unix.Close(fd)
		}
	})
	check := fmt.Sprintf("for fd in %d %d; do [ -e /proc/self/fd/$fd ] && echo fd $fd is open; done; true", inherited[0], inherited[1])
	onEveryFirstCommand(t, check, func(t *testing.T, res sandbox.ExecResult) {
		if len(res.Stdout) > 0 || res.ExitCode != 0 {
			t.Errorf("the sandbox's first command found the worker's inherited pipe (exit %d): %s%s", res.ExitCode, res.Stdout, res.Stderr)
		}
	})
}

// onEveryFirstCommand runs script with sh as the first command of a cold sandbox and of a warm
// one on each spare, and hands each result to check.
func onEveryFirstCommand(t *testing.T, script string, check func(t *testing.T, res sandbox.ExecResult)) {
	t.Helper()
	for _, tt := range []struct {
		name  string
		goSpr bool
		warm  bool
	}{
		{name: "cold"},
		{name: "warm, shell spare", warm: true},
		{name: "warm, Go spare", warm: true, goSpr: true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			p := sandboxtest.Bubblewrap(t)
			if tt.goSpr {
				sandbox.UseGoSpare(p)
			}
			check(t, runFirst(t, p, firstCommand{req: sandbox.ExecRequest{Argv: []string{"sh", "-c", script}}}, tt.warm))
		})
	}
}

// TestBubblewrapWorkersIgnoredSignalsStayOut: a signal the worker was started with ignored
// (SIGHUP under nohup, SIGINT and SIGHUP in a shell's background job) is at its default in
// every command of a sandbox, cold, warm on the shell spare or on the Go spare. Go keeps an
// ignored SIGHUP or SIGINT ignored, exec passes an ignored signal on, and neither bwrap nor the
// spare's shell (which may not reset a signal ignored on entry) sets it back: an agent's
// command could not be stopped with either, and `trap` in its scripts did nothing.
func TestBubblewrapWorkersIgnoredSignalsStayOut(t *testing.T) {
	sigs := []os.Signal{syscall.SIGHUP, syscall.SIGINT}
	signal.Ignore(sigs...) // as the worker's were, started under nohup or with &
	t.Cleanup(func() { signal.Reset(sigs...) })
	// SigIgn is a hexadecimal mask; bit 0 is SIGHUP, bit 1 SIGINT.
	check := `m=$(sed -n 's/^SigIgn:[[:space:]]*//p' /proc/self/status); echo "$((0x$m & 3))"`
	onEveryFirstCommand(t, check, func(t *testing.T, res sandbox.ExecResult) {
		if got := strings.TrimSpace(string(res.Stdout)); got != "0" || res.ExitCode != 0 {
			t.Errorf("the sandbox's first command has SIGHUP and SIGINT ignored as the worker's were (mask %q, exit %d): %s", got, res.ExitCode, res.Stderr)
		}
	})
}
