package sandbox

import "errors"

var (
	// ErrPathEscape marks a path that is absolute or leaves the workdir (.., symlinks).
	ErrPathEscape = errors.New("path outside the workdir")
	// ErrNotFound marks a file that does not exist in the sandbox.
	ErrNotFound = errors.New("no such file in the sandbox")
	// ErrNotDir marks a List of a path that exists but is not a folder (a regular file, a
	// symlink to one, a device...); read it with ReadFile instead.
	ErrNotDir = errors.New("not a folder")
	// ErrTooLarge marks a file larger than the caller allowed.
	ErrTooLarge = errors.New("file too large")
	// ErrClosed marks a call on a sandbox that was already closed.
	ErrClosed = errors.New("sandbox closed")
	// ErrUnavailable marks a backend that cannot start sandboxes on this host; the message says
	// what to install or configure.
	ErrUnavailable = errors.New("sandbox backend unavailable")
	// ErrDiskFull marks a workdir over its disk bound (SandboxSpec.Disk). Exec returns it with
	// the command's result; the job can still run commands that remove files.
	ErrDiskFull = errors.New("workdir over its disk bound")
)
