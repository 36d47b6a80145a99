// Package sandbox owns the isolated places where a job's tools run: the Provider and Sandbox
// contract and its backends, bubblewrap (one machine) and kubernetes (pods). It enforces
// containment and resource bounds; it does not decide which commands may run (that is the
// agent's policy).
package sandbox

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"path"
	"regexp"
	"strings"
	"time"

	"github.com/boxcar-run/boxcar/internal/config"
)

// Spec is what a sandbox is started from: the profile's sandbox spec, which only host
// configuration sets, and the job it serves. The spec must be complete
// (config.SandboxSpec.Complete), as config.Load returns it: backends fill in no default.
type Spec struct {
	JobID string
	// Tenant is the job's tenant: a backend whose sandboxes outlive a worker names it on them,
	// so that another worker's reaper can tell whose job a sandbox runs. Empty for a warm
	// sandbox until its claim.
	Tenant string
	// Pool, when set, starts the sandbox ahead of its job for the warm pool of the profile it
	// names: JobID is empty until Claimer.Claim binds it to one. Ahead is how long it may wait
	// for that; its Lifetime counts from the claim.
	Pool  string
	Ahead time.Duration
	config.SandboxSpec
}

// Provider starts sandboxes on one backend.
type Provider interface {
	// Start creates a sandbox and returns once commands can run in it.
	Start(ctx context.Context, spec Spec) (Sandbox, error)
	// Backend names the backend ("bubblewrap", "kubernetes").
	Backend() string
}

// Sandbox is one job's isolated workdir and process space. Paths are relative to the workdir;
// any path that would leave it fails with ErrPathEscape.
type Sandbox interface {
	// Exec runs argv inside the sandbox. A non-zero exit or a timeout is a result, not an error;
	// an error means the command could not be run or observed at all.
	Exec(ctx context.Context, req ExecRequest) (ExecResult, error)
	// WriteFile creates or replaces a regular file, creating parent folders.
	WriteFile(ctx context.Context, name string, data []byte) error
	// WriteFrom is WriteFile of exactly size bytes streamed from r, never held whole in
	// memory: for files as large as the workdir. A reader that fails, ends before size bytes
	// or holds more (ErrTooLarge) fails the write; what the file then holds is unspecified.
	WriteFrom(ctx context.Context, name string, r io.Reader, size int64) error
	// ReadFile reads a regular file of at most maxBytes; larger files fail with ErrTooLarge.
	// It follows symlinks that stay inside the workdir.
	ReadFile(ctx context.Context, name string, maxBytes int64) ([]byte, error)
	// Open opens a regular file of at most maxBytes for reading as a stream, for files too
	// large to hold in memory. It follows no symlink at all, not even one that stays inside
	// the workdir: a path with a link on it fails with ErrPathEscape (List follows none either,
	// so a path it listed has none, unless the job changed it since). Otherwise its answers are
	// ReadFile's: ErrNotFound, an error for what is no regular file, ErrTooLarge for a file
	// over maxBytes, and a Read fails with ErrTooLarge once a file that grew passes maxBytes.
	// ctx bounds the reads too, and so does the sandbox: once it is closing, reads fail. The
	// caller closes the reader.
	Open(ctx context.Context, name string, maxBytes int64) (io.ReadCloser, error)
	// List returns the regular files under dir (recursively), without following symlinks.
	// Folders beneath dir that cannot be read (nested past PATH_MAX, no permission) are left
	// out: then List returns the other files together with an *IncompleteError naming them.
	List(ctx context.Context, dir string) ([]FileInfo, error)
	// Info describes the sandbox for the provenance manifest.
	Info() Info
	// Close removes the sandbox and everything in it. It is safe to call more than once.
	Close(ctx context.Context) error
}

// ExecRequest is one command.
type ExecRequest struct {
	// Argv is run as is: never through a shell unless argv itself says sh -c.
	Argv []string
	// Stdin is fed to the process; nil means empty input.
	Stdin []byte
	// Env is the complete environment; nothing from the host leaks in. BOXCAR_EXEC is the
	// sandbox's own (execMark) and refused.
	Env map[string]string
	// Dir is workdir-relative; empty means the workdir.
	Dir string
	// Timeout kills the process and all its children when it passes. Zero means no timeout
	// beyond ctx.
	Timeout time.Duration
	// MaxOutputBytes caps stdout and stderr each; the rest is discarded and flagged. Zero means
	// DefaultMaxOutputBytes.
	MaxOutputBytes int
}

// DefaultMaxOutputBytes caps a stream when a request names no cap.
const DefaultMaxOutputBytes = 1 << 20

// ExecResult is what a command did.
type ExecResult struct {
	ExitCode        int           `json:"exit_code"`
	Stdout          []byte        `json:"-"`
	Stderr          []byte        `json:"-"`
	StdoutTruncated bool          `json:"stdout_truncated"`
	StderrTruncated bool          `json:"stderr_truncated"`
	TimedOut        bool          `json:"timed_out"`
	Duration        time.Duration `json:"duration"`
}

// FileInfo is one file in a listing.
type FileInfo struct {
	Path string      `json:"path"` // workdir-relative, slash separated
	Size int64       `json:"size"`
	Mode fs.FileMode `json:"mode"`
}

// maxListing bounds what one List holds in the worker's memory, on every backend: a workdir of
// millions of files, or of files with paths near PATH_MAX, must not exhaust it. Past it, List
// fails with ErrTooLarge and names the bound. A pod's answer is counted in the bytes it sends;
// a bubblewrap listing in its paths and listingRecord bytes a file, and the folders its walk
// has yet to read (workdir.go).
const maxListing = 64 << 20

// listingRecord is what one file costs a listing beside its path: its FileInfo, and the size
// and mode as a pod writes them.
const listingRecord = 64

// Info describes a running sandbox.
type Info struct {
	Backend     string `json:"backend"`
	ID          string `json:"id"`
	Image       string `json:"image,omitempty"`
	ImageDigest string `json:"image_digest,omitempty"`
	CPU         string `json:"cpu,omitempty"`
	Memory      string `json:"memory,omitempty"`
	Disk        string `json:"disk,omitempty"`
	PIDs        int    `json:"pids,omitempty"`
	Isolation   string `json:"isolation,omitempty"` // what the backend could enforce, e.g. "rlimits" or "cgroup"
	// Seccomp names the syscall filter the sandbox's processes run under, and SeccompDigest is
	// the sha256 of the filter program as loaded; empty where the backend sets none of its own
	// (a pod's RuntimeDefault profile is the runtime's, named in Isolation).
	Seccomp       string `json:"seccomp,omitempty"`
	SeccompDigest string `json:"seccomp_digest,omitempty"`
}

// CleanPath turns a workdir-relative path into its clean form, refusing absolute paths and any
// path that climbs out of the workdir. "" and "." name the workdir itself.
func CleanPath(name string) (string, error) {
	if strings.ContainsRune(name, 0) {
		return "", fmt.Errorf("%w: %q contains a NUL byte", ErrPathEscape, name)
	}
	if path.IsAbs(name) || strings.HasPrefix(name, `\`) {
		return "", fmt.Errorf("%w: %q is absolute; use a path relative to the workdir", ErrPathEscape, name)
	}
	clean := path.Clean("/" + name)[1:]
	for _, part := range strings.Split(name, "/") {
		if part == ".." {
			return "", fmt.Errorf("%w: %q climbs out with \"..\"", ErrPathEscape, name)
		}
	}
	if clean == "" {
		clean = "."
	}
	return clean, nil
}

var envName = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)

// execMark is the variable a pod's command carries to be found and killed by (execScript,
// tunnel's Mark), set before the request's Env: named there, it would replace the mark, and
// at the timeout no process of the command would carry it.
const execMark = "BOXCAR_EXEC"

// checkExec refuses requests no backend can pass on faithfully (a NUL byte would end an
// argument early in bwrap's NUL-separated options and in a pod's argv alike) and returns the
// clean workdir-relative folder and the output cap the request means.
func checkExec(req ExecRequest) (dir string, maxOut int, err error) {
	if len(req.Argv) == 0 || req.Argv[0] == "" {
		return "", 0, errors.New("sandbox: exec: empty argv; name a program")
	}
	name := req.Argv[0]
	for _, a := range req.Argv {
		if strings.ContainsRune(a, 0) {
			return "", 0, fmt.Errorf("sandbox: exec %s: an argument contains a NUL byte", name)
		}
	}
	for k, v := range req.Env {
		if !envName.MatchString(k) || strings.ContainsRune(v, 0) {
			return "", 0, fmt.Errorf("sandbox: exec %s: environment variable %q: names are letters, digits and _, and values hold no NUL byte", name, k)
		}
		if k == execMark {
			return "", 0, fmt.Errorf("sandbox: exec %s: environment variable %s is the sandbox's own (it marks the command's processes to kill them); name it otherwise", name, k)
		}
	}
	if req.Timeout < 0 || req.MaxOutputBytes < 0 {
		return "", 0, fmt.Errorf("sandbox: exec %s: Timeout and MaxOutputBytes must not be negative", name)
	}
	if dir, err = CleanPath(req.Dir); err != nil {
		return "", 0, fmt.Errorf("sandbox: exec %s: dir: %w", name, err)
	}
	maxOut = req.MaxOutputBytes
	if maxOut == 0 {
		maxOut = DefaultMaxOutputBytes
	}
	return dir, maxOut, nil
}
