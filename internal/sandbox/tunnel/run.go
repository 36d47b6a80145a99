package tunnel

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"
)

// Exec is a command the pod's side starts itself instead of running the command's argv (the
// backend's exec script, podscripts/exec.sh, which is what a pod's side that does not know
// Exec runs): the same program, folder, environment and timeout, without the script's shell,
// its env, its watchdog and the grep of its kill, each a process the pod's CPU bound makes
// slow. As the script does, it starts Argv in Dir with Env alone plus the command's Mark (no
// variable of the container's), hands it stdin, kills the command's tree (commandSet.kill) at
// Timeout and once the command has ended, and reports a Dir that is not there as
// "boxcar-NONCE: notfound" on stderr with exit code 125, a program that is not there as exit
// code 127 and one that cannot run as 126.
type Exec struct {
	Argv    []string      `json:"argv"`
	Dir     string        `json:"dir"`
	Env     []string      `json:"env"` // NAME=VALUE
	Timeout time.Duration `json:"timeout,omitempty"`
	Nonce   string        `json:"nonce"`
}

// defaultPath is the search path of a command whose Env has no PATH, as execvp's.
const defaultPath = "/bin:/usr/bin"

// serveExec runs x to its end with stdin and sends its output and exit code. mark is the
// command's Mark (required: it is how the command's processes are found).
func serveExec(ctx context.Context, set *commandSet, x *Exec, mark string, stdin io.Reader, fw *frameWriter) {
	if len(x.Argv) == 0 || !strings.HasPrefix(mark, "BOXCAR_EXEC=") {
		_ = fw.frame(frameFailed, []byte("exec: no argv, or no BOXCAR_EXEC mark"))
		return
	}
	if fi, err := os.Stat(x.Dir); err != nil || !fi.IsDir() {
		_ = fw.frame(frameStderr, fmt.Appendf(nil, "boxcar-%s: notfound\n", x.Nonce))
		sendExit(fw, 125)
		return
	}
	prog, code := lookPath(x.Argv[0], x.Dir, x.Env)
	if code != 0 {
		_ = fw.frame(frameStderr, fmt.Appendf(nil, "boxcar: %s: %s\n", x.Argv[0], map[int]string{126: "cannot run", 127: "not found"}[code]))
		sendExit(fw, code)
		return
	}
	cmd := &exec.Cmd{Path: prog, Args: x.Argv, Dir: x.Dir, Env: append([]string{mark}, x.Env...)}
	sendExit(fw, runMarked(ctx, set, cmd, mark, x.Timeout, stdin, fw))
}

// runMarked runs cmd with its own pipes and returns its exit code: at timeout, or when ctx
// ends, its tree is killed (set.kill: what carries mark, what is beneath cmd, what it
// orphaned), and once it has ended what is left of it; its output is read until whatever still
// held it is gone, for a second at most.
func runMarked(ctx context.Context, set *commandSet, cmd *exec.Cmd, mark string, timeout time.Duration, stdin io.Reader, fw *frameWriter) int {
	var files [6]*os.File // stdin, stdout, stderr: the command's end, then this side's
	for i := range 3 {
		r, w, err := os.Pipe()
		if err != nil {
			_ = fw.frame(frameStderr, fmt.Appendf(nil, "boxcar: %v\n", err))
			closeAll(files[:])
			return 126
		}
		if i == 0 {
			files[0], files[3] = r, w
		} else {
			files[i], files[i+3] = w, r
		}
	}
	cmd.Stdin, cmd.Stdout, cmd.Stderr = files[0], files[1], files[2]
	err := set.start(cmd, mark)
	closeAll(files[:3])
	if err != nil {
		closeAll(files[3:])
		_ = fw.frame(frameStderr, fmt.Appendf(nil, "boxcar: %s: %v\n", cmd.Args[0], err))
		return 126
	}
	go func() {
		_, _ = io.Copy(files[3], stdin)
		files[3].Close()
	}()
	copied := make(chan struct{}, 2)
	for i, kind := range []byte{frameStdout, frameStderr} {
		go func() {
			_, _ = io.Copy(fw.kind(kind), files[4+i])
			copied <- struct{}{}
		}()
	}
	root := cmd.Process.Pid
	killAll := func() { set.kill(mark, root) }
	var timer *time.Timer
	if timeout > 0 {
		timer = time.AfterFunc(timeout, killAll)
	}
	stop := context.AfterFunc(ctx, killAll)
	err = cmd.Wait()
	if timer != nil {
		timer.Stop()
	}
	stop()
	// Waited for, the root's pid may be reused: what it left is found as orphans now.
	set.done(root)
	set.kill(mark, 0)
	bound := time.Now().Add(time.Second)
	_ = files[4].SetReadDeadline(bound)
	_ = files[5].SetReadDeadline(bound)
	<-copied
	<-copied
	closeAll(files[4:])
	if err == nil {
		return 0
	}
	return exitCode(err)
}

func closeAll(files []*os.File) {
	for _, f := range files {
		if f != nil {
			f.Close()
		}
	}
}

// lookPath finds name as execvp would with env's PATH, relative to dir; 0 and the path, or
// 127 for a program that is not there and 126 for one that cannot run.
func lookPath(name, dir string, env []string) (string, int) {
	if strings.Contains(name, "/") {
		p := name
		if !filepath.IsAbs(p) {
			p = filepath.Join(dir, p)
		}
		return p, runnable(p)
	}
	search := defaultPath
	for _, e := range env {
		if v, ok := strings.CutPrefix(e, "PATH="); ok {
			search = v
		}
	}
	code := 127
	for d := range strings.SplitSeq(search, ":") {
		if d == "" {
			d = "."
		}
		if !filepath.IsAbs(d) {
			d = filepath.Join(dir, d)
		}
		p := filepath.Join(d, name)
		switch c := runnable(p); c {
		case 0:
			return p, 0
		case 126:
			code = 126 // execvp reports EACCES if nothing later runs
		}
	}
	return "", code
}

// runnable is 0 for a regular file this process may execute, 126 for one it may not, 127
// when there is none.
func runnable(p string) int {
	fi, err := os.Stat(p)
	switch {
	case errors.Is(err, os.ErrNotExist) || errors.Is(err, syscall.ENOTDIR):
		return 127
	case err != nil || fi.IsDir() || syscall.Access(p, 1) != nil: // 1: X_OK
		return 126
	}
	return 0
}
