package tunnel

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"syscall"
)

// File is a file operation the pod's side of a command session does itself instead of running
// the command's argv: no shell, no process, so a warm pod's input writes cost a stream and a
// few system calls rather than a shell and the half dozen tools the backend's file script
// starts. A pod's side that does not know the operation (an older bridge) runs the argv, the
// same script, so the result is the same either way.
//
// The checks are the script's (podscripts/file.sh), made on the pod's own view of its files:
// the workdir and every path are resolved inside the pod, symlinks included, and refused
// unless they stay beneath the workdir; no folder is made before the deepest existing one on
// the way is known to be inside; and a symlink where the file is written is replaced, not
// written through. A failure is reported as the script reports it: "boxcar-NONCE: REASON" on
// stderr and exit code 125.
type File struct {
	// Op is the operation: FileWrite.
	Op string `json:"op"`
	// Nonce marks the failure line.
	Nonce string `json:"nonce"`
	// Dir is the workdir, absolute; Path the file's path beneath it, relative and clean.
	Dir  string `json:"dir"`
	Path string `json:"path"`
	// Mode, when set, is the written file's permission bits whatever the pod's umask (the
	// egress CA's 0644, as its script's umask 022 gives); unset, the umask decides, as for
	// file.sh. A pod's side that predates it leaves it to the umask.
	Mode os.FileMode `json:"mode,omitempty"`
}

// FileWrite creates or replaces the file at Path with the command's stdin, making its
// folders, as file.sh's write does.
const FileWrite = "write"

// fileFailure is a refusal the worker turns into its sentinel error (fileRun).
type fileFailure string

// osFailure is the script's "os: " report of err's errno, in glibc's words as the pod's tools
// say it (Go's own, capitalised); an error of no errno is an "ioerror".
func osFailure(err error) fileFailure {
	var errno syscall.Errno
	if !errors.As(err, &errno) {
		return failIOError
	}
	text := errno.Error()
	return fileFailure("os: " + strings.ToUpper(text[:1]) + text[1:])
}

func (f fileFailure) Error() string { return string(f) }

const (
	failNotFound fileFailure = "notfound"
	failEscape   fileFailure = "escape"
	failIsDir    fileFailure = "isdir"
	failIOError  fileFailure = "ioerror"
)

// serveFile does f with stdin and reports as the script would: stderr's failure line and its
// exit code.
func serveFile(f *File, stdin io.Reader, fw *frameWriter) {
	code := 0
	err := doFile(f, stdin)
	if err != nil {
		var reason fileFailure
		if !errors.As(err, &reason) {
			reason = failIOError
		}
		_ = fw.frame(frameStderr, fmt.Appendf(nil, "boxcar-%s: %s\n", f.Nonce, reason))
		code = 125
	}
	sendExit(fw, code)
}

func doFile(f *File, stdin io.Reader) error {
	if f.Op != FileWrite {
		return fmt.Errorf("unknown file operation %q", f.Op)
	}
	if !filepath.IsAbs(f.Dir) || f.Path == "" || filepath.IsAbs(f.Path) || filepath.Clean(f.Path) != f.Path ||
		f.Path == "." || f.Path == ".." || strings.HasPrefix(f.Path, "../") {
		return failEscape
	}
	return writeFile(f, stdin)
}

// writeFile is file.sh's write, step for step.
func writeFile(f *File, stdin io.Reader) error {
	w, err := realDir(f.Dir)
	if err != nil {
		return failNotFound
	}
	inside := func(r string) bool { return strings.HasPrefix(r+"/", w+"/") }
	p := w + "/" + f.Path
	d := filepath.Dir(p)
	a := d
	for !exists(a) {
		a = filepath.Dir(a)
	}
	if ra, err := realPath(a); err != nil || !inside(ra) {
		return failEscape
	}
	_ = os.MkdirAll(d, 0o777) // as mkdir -p: what it could not make, the next step finds
	rd, err := realDir(d)
	if err != nil {
		return osFailure(err) // the script's `there "$d/."`
	}
	if !inside(rd) {
		return failEscape
	}
	target := rd + "/" + filepath.Base(p)
	if fi, err := os.Lstat(target); err == nil && fi.IsDir() {
		return failIsDir
	}
	tmp := rd + "/.boxcar-write-" + f.Nonce
	if err := copyTo(tmp, stdin, f.Mode.Perm()); err != nil {
		_ = os.Remove(tmp)
		return osFailure(err)
	}
	// A rename replaces a symlink rather than writing through it; removing it first keeps
	// the script's order.
	if fi, err := os.Lstat(target); err == nil && fi.Mode()&os.ModeSymlink != 0 {
		_ = os.Remove(target)
	}
	if err := os.Rename(tmp, target); err != nil {
		_ = os.Remove(tmp)
		return osFailure(err)
	}
	return nil
}

// copyTo writes r to a new file at name, refusing one that exists or is a symlink (the name
// carries the call's nonce: nothing of the sandbox's should be there); mode, when not 0, is
// its permission bits whatever the umask.
func copyTo(name string, r io.Reader, mode os.FileMode) error {
	out, err := os.OpenFile(name, os.O_WRONLY|os.O_CREATE|os.O_EXCL|syscall.O_NOFOLLOW, 0o666)
	if err != nil {
		return err
	}
	if mode != 0 {
		err = out.Chmod(mode)
	}
	if err == nil {
		_, err = io.Copy(out, r)
	}
	return errors.Join(err, out.Close())
}

// exists is the script's [ -e "$a" ] || [ -L "$a" ].
func exists(name string) bool {
	_, err := os.Lstat(name)
	return err == nil
}

// realDir is cd -- "$d" && pwd -P: the folder's path with every symlink resolved.
func realDir(name string) (string, error) {
	r, err := filepath.EvalSymlinks(name)
	if err != nil {
		return "", err
	}
	fi, err := os.Stat(r)
	if err != nil {
		return "", err
	}
	if !fi.IsDir() {
		return "", &os.PathError{Op: "cd", Path: name, Err: syscall.ENOTDIR}
	}
	return r, nil
}

// realPath is readlink -f: the path with every symlink resolved, its last component allowed
// to be missing (a dangling symlink resolves to where it points).
func realPath(name string) (string, error) {
	for range 40 { // the kernel's bound on symlinks in one lookup
		r, err := filepath.EvalSymlinks(name)
		if err == nil {
			return r, nil
		}
		fi, lerr := os.Lstat(name)
		if lerr != nil {
			// Missing: its folder must resolve.
			dir, derr := filepath.EvalSymlinks(filepath.Dir(name))
			if derr != nil {
				return "", derr
			}
			return filepath.Join(dir, filepath.Base(name)), nil
		}
		if fi.Mode()&os.ModeSymlink == 0 {
			return "", err
		}
		to, err := os.Readlink(name)
		if err != nil {
			return "", err
		}
		if !filepath.IsAbs(to) {
			to = filepath.Join(filepath.Dir(name), to)
		}
		name = to
	}
	return "", errors.New("too many levels of symbolic links")
}
