// Package spare is the helper a warm bubblewrap sandbox's first command starts from: the
// worker's own binary, started by bwrap ahead of the command with the sandbox's namespaces,
// mounts, rlimits, cgroup and seccomp filter in force, waiting on a pipe. Told a command, it
// takes on the command's environment and folder and executes it in its own place (execve), so
// the command runs as pid 2 of the sandbox exactly as when bwrap starts it, with nothing of the
// helper left: its descriptors close on exec. It adds no power: it runs under everything the
// command runs under, and only until the command replaces it.
//
// Like package bridge it runs from its init and imports the standard library alone, and of
// that only packages that initialise in microseconds: Go initialises a package as soon as its
// imports are, so a helper that imported fmt, bytes or strings (and through them unicode's
// tables and reflect) ran after most of the binary's packages had initialised, 20-30 ms into
// its start on a loaded host, and a job's first command waited for that (docs/sandbox.md).
// TestImportsStayLight keeps it so.
package spare

import (
	"errors"
	"io"
	"os"
	"strconv"
	"syscall"
)

// Arg marks the helper's command line: /proc/self/fd/<binary> Arg <request fd> <ready fd>.
const Arg = "__boxcar-spare"

func init() {
	if len(os.Args) == 4 && os.Args[1] == Arg {
		os.Exit(run(os.Args[2], os.Args[3]))
	}
}

// Encode is the request for a command: argv, then the environment (NAME=value), then the
// folder and whether the command has input ("1"; else its stdin is /dev/null, as a command
// without input has from bwrap), each field ended by a NUL and each list led by its length.
func Encode(argv, env []string, dir string, stdin bool) []byte {
	var b []byte
	field := func(s string) {
		b = append(append(b, s...), 0)
	}
	for _, list := range [][]string{argv, env} {
		field(strconv.Itoa(len(list)))
		for _, s := range list {
			field(s)
		}
	}
	field(dir)
	field(map[bool]string{true: "1", false: "0"}[stdin])
	return b
}

func decode(data []byte) (argv, env []string, dir string, stdin bool, err error) {
	fields := splitOn(string(data), 0)
	next := func() (string, bool) {
		if len(fields) == 0 {
			return "", false
		}
		f := fields[0]
		fields = fields[1:]
		return f, true
	}
	list := func() ([]string, bool) {
		f, ok := next()
		n, err := strconv.Atoi(f)
		if !ok || err != nil || n < 0 || n > len(fields) {
			return nil, false
		}
		out := fields[:n]
		fields = fields[n:]
		return out, true
	}
	var ok1, ok2, ok3, ok4 bool
	var in string
	argv, ok1 = list()
	env, ok2 = list()
	dir, ok3 = next()
	in, ok4 = next()
	if !ok1 || !ok2 || !ok3 || !ok4 || len(argv) == 0 {
		return nil, nil, "", false, errors.New("malformed request")
	}
	return argv, env, dir, in == "1", nil
}

// run says it is ready, waits for its request and executes it. A request that never comes
// (the worker closed the pipe: the sandbox is closing) ends it quietly.
func run(reqFD, readyFD string) int {
	req, ready := fdFile(reqFD), fdFile(readyFD)
	if req == nil || ready == nil {
		say("bwrap: spare: bad descriptors")
		return 1
	}
	syscall.CloseOnExec(int(req.Fd()))
	_, _ = ready.Write([]byte{1})
	ready.Close()
	data, err := io.ReadAll(req)
	req.Close()
	if err != nil || len(data) == 0 {
		return 0
	}
	argv, env, dir, stdin, err := decode(data)
	if err != nil {
		say("bwrap: spare: " + err.Error())
		return 1
	}
	if !stdin {
		null, err := syscall.Open("/dev/null", syscall.O_RDONLY, 0)
		if err == nil {
			err = syscall.Dup3(null, 0, 0)
			syscall.Close(null)
		}
		if err != nil {
			say("bwrap: spare: open /dev/null: " + err.Error())
			return 1
		}
	}
	// "bwrap: " marks a failure of the sandbox itself, as bwrap would say it (the sandbox
	// package's launcherFailure); a command that cannot be executed says so as execvp does.
	if err := syscall.Chdir(dir); err != nil {
		say("bwrap: Can't chdir to " + dir + ": " + err.Error())
		return 1
	}
	errno := execvp(argv, env)
	say("bwrap: execvp " + argv[0] + ": " + errno.Error())
	return 1
}

// say writes line to stderr, where the sandbox package reads a launcher's failure.
func say(line string) {
	_, _ = os.Stderr.WriteString(line + "\n")
}

func fdFile(s string) *os.File {
	n, err := strconv.Atoi(s)
	if err != nil || n < 3 {
		return nil
	}
	return os.NewFile(uintptr(n), "fd"+s)
}

// execvp executes argv as execvp(3) does, searching the PATH of env for a name without a
// slash; it returns only on failure, with the error execvp would leave in errno.
func execvp(argv, env []string) syscall.Errno {
	// The helper's own descriptor closes on the command's exec.
	if self, ok := cutPrefix(os.Args[0], "/proc/self/fd/"); ok {
		if n, err := strconv.Atoi(self); err == nil {
			syscall.CloseOnExec(n)
		}
	}
	name := argv[0]
	for i := range len(name) {
		if name[i] == '/' {
			return errnoOf(syscall.Exec(name, argv, env))
		}
	}
	path := "/usr/local/bin:/usr/bin:/bin"
	for _, kv := range env {
		if v, ok := cutPrefix(kv, "PATH="); ok {
			path = v
		}
	}
	result := syscall.ENOENT
	for _, d := range splitOn(path, ':') {
		if d == "" {
			d = "."
		}
		switch e := errnoOf(syscall.Exec(d+"/"+name, argv, env)); e {
		case syscall.ENOENT, syscall.ENOTDIR, syscall.ELOOP, syscall.ENAMETOOLONG:
		case syscall.EACCES:
			result = e
		default:
			return e
		}
	}
	return result
}

func cutPrefix(s, prefix string) (string, bool) {
	if len(s) >= len(prefix) && s[:len(prefix)] == prefix {
		return s[len(prefix):], true
	}
	return s, false
}

// splitOn cuts s at every sep, as strings.Split does.
func splitOn(s string, sep byte) []string {
	var out []string
	start := 0
	for i := range len(s) {
		if s[i] == sep {
			out = append(out, s[start:i])
			start = i + 1
		}
	}
	return append(out, s[start:])
}

func errnoOf(err error) syscall.Errno {
	var e syscall.Errno
	if errors.As(err, &e) {
		return e
	}
	return syscall.EINVAL
}
