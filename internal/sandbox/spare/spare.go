// Package spare is the helper a warm bubblewrap sandbox's first command starts from: the
// worker's own binary, started by bwrap ahead of the command with the sandbox's namespaces,
// mounts, rlimits, cgroup and seccomp filter in force, waiting on a pipe. Told a command, it
// takes on the command's environment and folder and executes it in its own place (execve), so
// the command runs as pid 2 of the sandbox exactly as when bwrap starts it, with nothing of the
// helper left: its descriptors close on exec. It adds no power: it runs under everything the
// command runs under, and only until the command replaces it.
//
// Like package bridge it runs from its init, before the binary's heavy packages initialise,
// and imports the standard library alone.
package spare

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
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
	var b bytes.Buffer
	field := func(s string) {
		b.WriteString(s)
		b.WriteByte(0)
	}
	for _, list := range [][]string{argv, env} {
		field(strconv.Itoa(len(list)))
		for _, s := range list {
			field(s)
		}
	}
	field(dir)
	field(map[bool]string{true: "1", false: "0"}[stdin])
	return b.Bytes()
}

func decode(data []byte) (argv, env []string, dir string, stdin bool, err error) {
	fields := strings.Split(string(data), "\x00")
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
		fmt.Fprintln(os.Stderr, "bwrap: spare: bad descriptors")
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
		fmt.Fprintf(os.Stderr, "bwrap: spare: %v\n", err)
		return 1
	}
	if !stdin {
		null, err := syscall.Open("/dev/null", syscall.O_RDONLY, 0)
		if err == nil {
			err = syscall.Dup3(null, 0, 0)
			syscall.Close(null)
		}
		if err != nil {
			fmt.Fprintf(os.Stderr, "bwrap: spare: open /dev/null: %v\n", err)
			return 1
		}
	}
	// "bwrap: " marks a failure of the sandbox itself, as bwrap would say it (the sandbox
	// package's launcherFailure); a command that cannot be executed says so as execvp does.
	if err := syscall.Chdir(dir); err != nil {
		fmt.Fprintf(os.Stderr, "bwrap: Can't chdir to %s: %v\n", dir, err)
		return 1
	}
	errno := execvp(argv, env)
	fmt.Fprintf(os.Stderr, "bwrap: execvp %s: %s\n", argv[0], errno.Error())
	return 1
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
	self := os.Args[0] // the helper's own descriptor closes on the command's exec
	if strings.HasPrefix(self, "/proc/self/fd/") {
		if n, err := strconv.Atoi(strings.TrimPrefix(self, "/proc/self/fd/")); err == nil {
			syscall.CloseOnExec(n)
		}
	}
	name := argv[0]
	if strings.Contains(name, "/") {
		return errnoOf(syscall.Exec(name, argv, env))
	}
	path := "/usr/local/bin:/usr/bin:/bin"
	for _, kv := range env {
		if v, ok := strings.CutPrefix(kv, "PATH="); ok {
			path = v
		}
	}
	result := syscall.ENOENT
	for _, d := range strings.Split(path, ":") {
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

func errnoOf(err error) syscall.Errno {
	var e syscall.Errno
	if errors.As(err, &e) {
		return e
	}
	return syscall.EINVAL
}
