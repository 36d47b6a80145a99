package sandbox

import (
	"errors"
	"fmt"
	"strings"
	"syscall"

	"github.com/boxcar-run/boxcar/internal/textcut"
)

var (
	// ErrPathEscape marks a path that is absolute or leaves the workdir (.., symlinks).
	ErrPathEscape = errors.New("path outside the workdir")
	// ErrNotFound marks a file that does not exist in the sandbox.
	ErrNotFound = errors.New("no such file in the sandbox")
	// ErrNotDir marks a List of a path that exists but is not a folder (a regular file, a
	// symlink to one, a device...); read it with ReadFile instead.
	ErrNotDir = errors.New("not a folder")
	// ErrTooLarge marks a file larger than the caller allowed, or a List whose answer would
	// pass the bound every backend holds it to (64 MiB); list a subfolder instead.
	ErrTooLarge = errors.New("file too large")
	// ErrClosed marks a call on a sandbox that was already closed.
	ErrClosed = errors.New("sandbox closed")
	// ErrUnavailable marks a backend that cannot start sandboxes now: on this host (the message
	// says what to install or configure), or while its cluster does not answer, refuses the
	// worker, or has no room (kubernetes_unavailable.go). It is no fault of the job.
	ErrUnavailable = errors.New("sandbox backend unavailable")
	// ErrSandboxLost marks a call on a sandbox that went away from outside while it was in
	// use: its pod deleted, evicted, preempted or past its deadline; its workdir removed from
	// the host. No call on it can succeed again and what the job left in it is gone. An
	// eviction for passing the workdir's disk bound wraps ErrDiskFull too.
	ErrSandboxLost = errors.New("sandbox lost")
	// ErrDiskFull marks a workdir over its disk bound (SandboxSpec.Disk), or a command killed
	// for the files it made in its /tmp or /dev/shm. Exec returns it with the command's result;
	// the job can still run commands that remove files.
	ErrDiskFull = errors.New("over the sandbox's disk bound")
	// ErrNoEgress marks a sandbox that cannot be given a network as configured (a pod
	// backend without a bridge image); the message says what to set.
	ErrNoEgress = errors.New("sandbox backend gives no egress")
)

// ErrNotRegular marks a file that is not a regular one (a folder, a FIFO, a socket, a
// device), which no read takes.
var ErrNotRegular = errors.New("not a regular file")

// The texts of ErrNotRegular, as the backends say them.
var (
	errIsFolder   = notRegular("is a folder, not a file")
	errNotRegular = notRegular("is not a regular file")
)

// notRegular is ErrNotRegular in words of its own.
type notRegular string

func (e notRegular) Error() string        { return string(e) }
func (e notRegular) Is(target error) bool { return target == ErrNotRegular } //nolint:errorlint // Is compares the target itself

// errDenied is a file the job left unreadable to the sandbox's user, as a pod's file script
// finds it (test -r): the class is syscall.EACCES, which the bubblewrap backend's os errors
// carry, so that one class names it on both backends; the shell's words ("can't open …:
// Permission denied") carry no errno, and read as a failure of the worker's side.
var errDenied error = syscall.EACCES

// ErrIncomplete marks a List that left out folders it could not read (nested past PATH_MAX, no
// permission); List returns it, as an *IncompleteError naming them, with the other files.
var ErrIncomplete = errors.New("listing incomplete")

// maxSkipped bounds how many unreadable folders an IncompleteError names: a job can make any
// number of them.
const maxSkipped = 16

// IncompleteError names the folders a List left out and why.
type IncompleteError struct {
	Dir     string
	Skipped []Skipped // the first maxSkipped
	More    int       // how many more were left out
}

// Skipped is one folder a List left out.
type Skipped struct {
	Path   string // workdir-relative; a path too long to hold is cut and ends in "…"
	Reason string
}

func (e *IncompleteError) Error() string {
	parts := make([]string, len(e.Skipped))
	for i, s := range e.Skipped {
		parts[i] = s.Path + " (" + s.Reason + ")"
	}
	more := ""
	if e.More > 0 {
		more = fmt.Sprintf(" and %d more", e.More)
	}
	return fmt.Sprintf("sandbox: list %s: left out what could not be read: %s%s", e.Dir, strings.Join(parts, ", "), more)
}

func (e *IncompleteError) Unwrap() error { return ErrIncomplete }

// add records one more folder left out.
func (e *IncompleteError) add(path, reason string) {
	if len(e.Skipped) == maxSkipped {
		e.More++
		return
	}
	e.Skipped = append(e.Skipped, Skipped{Path: ShortPath(path, maxSkippedPath), Reason: reason})
}

// maxSkippedPath bounds a skipped path as named: a folder nested past PATH_MAX has a name of
// many kilobytes.
const maxSkippedPath = 256

// ShortPath cuts p to at most max bytes, on a rune boundary, ending it in "…" when cut: for
// naming in a log line or a manifest a path a job made as long as it liked.
func ShortPath(p string, max int) string {
	if len(p) <= max {
		return p
	}
	return textcut.Head(p, max) + "…"
}
