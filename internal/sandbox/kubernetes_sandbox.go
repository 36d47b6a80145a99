package sandbox

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"path"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/boxcar-run/boxcar/internal/sandbox/tunnel"
)

// kubernetesSandbox is one pod. Commands and file transfers run through exec, each wrapped in a
// small POSIX sh script, so the image needs sh and the usual busybox or coreutils tools (env,
// grep with -z, readlink -f, stat, find, cat, mv).
type kubernetesSandbox struct {
	p       *KubernetesProvider
	name    string
	workdir string
	info    Info
	log     *slog.Logger
	// created is just before the pod was created, and lifetime the spec's: a claim counts
	// the pod's deadline from them (kubernetes_pool.go).
	created  time.Time
	lifetime time.Duration
	// pod is the pod as created: a claim describes its isolation with the new deadline.
	pod *corev1.Pod

	*calls

	closeMu sync.Mutex
	deleted bool

	egressMu sync.Mutex
	egressOn bool

	// cmds is a warm pod's command session (kubernetes_session.go), nil without one; set
	// before the sandbox is handed out. stopCmds ends it.
	cmds     *tunnel.Commands
	stopCmds func()
}

// Close stops running commands and deletes the pod. It is idempotent.
func (s *kubernetesSandbox) Close(ctx context.Context) error {
	s.shutdown(fmt.Errorf("sandbox %s: %w", s.name, ErrClosed))
	s.p.poolPods.remove(s.name) // from now on, a pod the delete missed is the reaper's

	s.closeMu.Lock()
	defer s.closeMu.Unlock()
	if s.deleted {
		return nil
	}
	// Running commands are being killed inside the pod; deleting it ends them in any case,
	// so wait only briefly.
	select {
	case <-s.idle:
	case <-ctx.Done():
	case <-time.After(killGrace):
	}
	if s.stopCmds != nil {
		s.stopCmds()
	}
	if err := s.p.deletePod(ctx, s.log, s.name); err != nil {
		return err
	}
	s.deleted = true
	s.log.Info("sandbox closed")
	return nil
}

// Info describes the sandbox.
func (s *kubernetesSandbox) Info() Info { return s.info }

// file runs fileScript as a call on the sandbox; see fileRun.
func (s *kubernetesSandbox) file(ctx context.Context, op, name string, stdin io.Reader, stdout io.Writer, extra ...string) error {
	id, err := s.begin(nil)
	if err != nil {
		return fmt.Errorf("sandbox: %s %s: %w", op, name, err)
	}
	defer s.end(id)
	return s.fileRun(ctx, op, name, stdin, stdout, extra...)
}

// fileRun runs fileScript; a failure the script reports becomes the matching sentinel.
func (s *kubernetesSandbox) fileRun(ctx context.Context, op, name string, stdin io.Reader, stdout io.Writer, extra ...string) error {
	nonce := randomHex(8)
	stderr := &cappedBuffer{max: 4096}
	argv := append([]string{"sh", "-c", fileScript, "boxcar-file", op, nonce, s.workdir, name}, extra...)
	cmd := tunnel.Command{Argv: argv, Stdin: stdin, Stdout: stdout, Stderr: stderr}
	if op == "write" {
		// A command session writes it itself, with the script's checks; pods/exec runs the script.
		cmd.File = &tunnel.File{Op: tunnel.FileWrite, Nonce: nonce, Dir: s.workdir, Path: name}
	}
	code, err := s.run(ctx, cmd)
	switch {
	case err != nil:
		return s.execFailure(ctx, op+" "+name, err)
	case code == 0:
		return nil
	}
	errOut, _ := stderr.take()
	reason, ok := bytes.CutPrefix(bytes.TrimSpace(errOut), []byte("boxcar-"+nonce+": "))
	if code != 125 || !ok {
		return fmt.Errorf("sandbox: %s %s: exit %d: %s", op, name, code, firstLine(errOut, nil))
	}
	if text, ok := bytes.CutPrefix(reason, []byte("os: ")); ok {
		if errno, ok := podErrno(string(text)); ok {
			return pathError(op, name, errno)
		}
	}
	if class := fileReasons[string(reason)]; class != nil {
		return class(op, name, extra)
	}
	return fmt.Errorf("sandbox: %s %s: %s", op, name, reason)
}

// fileReasons are the failures file.sh (and a command session's own write) reports in a word
// of its own, each as its class; one it reports as "os: " and an errno's text is classed as
// bubblewrap classes that errno (podErrnos, pathError).
var fileReasons = map[string]func(op, name string, extra []string) error{
	"notfound": func(op, name string, _ []string) error {
		return fmt.Errorf("sandbox: %s %s: %w", op, name, ErrNotFound)
	},
	"escape": func(op, name string, _ []string) error {
		if op == "open" {
			return fmt.Errorf("sandbox: open %s: a symlink is on the way and open follows none: %w", name, ErrPathEscape)
		}
		return fmt.Errorf("sandbox: %s %s: a symlink leads out of the workdir: %w", op, name, ErrPathEscape)
	},
	// Only a read or an open has a bound, and its script alone says "toolarge"; but what runs
	// in the pod, the job's processes among it, can answer any operation with any word.
	"toolarge": func(op, name string, extra []string) error {
		if len(extra) == 0 {
			return fmt.Errorf("sandbox: %s %s: %w", op, name, ErrTooLarge)
		}
		return fmt.Errorf("sandbox: %s %s: more than the %s bytes allowed: %w", op, name, extra[0], ErrTooLarge)
	},
	"isdir": func(op, name string, _ []string) error {
		return fmt.Errorf("sandbox: %s %s: %w", op, name, errIsFolder)
	},
	"notdir": func(op, name string, _ []string) error {
		return fmt.Errorf("sandbox: %s %s: read a file with ReadFile: %w", op, name, ErrNotDir)
	},
	"notregular": func(op, name string, _ []string) error {
		return fmt.Errorf("sandbox: %s %s: %w", op, name, errNotRegular)
	},
	"denied": func(op, name string, _ []string) error { return fmt.Errorf("sandbox: %s %s: %w", op, name, errDenied) },
}

// podErrnos are the errnos a pod's file operation can meet on the job's files, each with its
// text in musl's words; glibc's are Go's own (Errno.Error), which a command session's write
// reports. A pod's tools say an errno only in words, and one told by no row reads as a
// failure of the worker's side: a name past NAME_MAX was "no such file", or, written, an
// unclassed "ioerror", while bubblewrap said ENAMETOOLONG (sandboxtest's FileErrnosClassed).
var podErrnos = []struct {
	errno syscall.Errno
	musl  string
}{
	{syscall.ENOENT, "No such file or directory"},
	{syscall.ENOTDIR, "Not a directory"},
	{syscall.EISDIR, "Is a directory"},
	{syscall.ENAMETOOLONG, "Filename too long"},
	{syscall.ELOOP, "Symbolic link loop"},
	{syscall.ENOSPC, "No space left on device"},
	{syscall.EDQUOT, "Quota exceeded"},
	{syscall.EFBIG, "File too large"},
	{syscall.EROFS, "Read-only file system"},
	{syscall.EACCES, "Permission denied"},
	{syscall.EPERM, "Operation not permitted"},
	{syscall.EEXIST, "File exists"},
	{syscall.ENOTEMPTY, "Directory not empty"},
	{syscall.EMLINK, "Too many links"},
	{syscall.EIO, "I/O error"},
	{syscall.EXDEV, "Cross-device link"},
}

// podErrno is the errno whose text, glibc's or musl's, a pod's tool said.
func podErrno(text string) (syscall.Errno, bool) {
	for _, e := range podErrnos {
		if strings.EqualFold(text, e.errno.Error()) || strings.EqualFold(text, e.musl) {
			return e.errno, true
		}
	}
	return 0, false
}

// WriteFile creates or replaces a regular file in the workdir, creating parent folders.
func (s *kubernetesSandbox) WriteFile(ctx context.Context, name string, data []byte) error {
	clean, err := CleanPath(name)
	if err != nil {
		return fmt.Errorf("sandbox: write: %w", err)
	}
	if clean == "." {
		return fmt.Errorf("sandbox: write %q: names the workdir itself; name a file: %w", name, ErrPathEscape)
	}
	return s.file(ctx, "write", clean, bytes.NewReader(data), io.Discard)
}

// WriteFrom creates or replaces a regular file in the workdir with exactly size bytes of r,
// streamed to the pod's stdin.
func (s *kubernetesSandbox) WriteFrom(ctx context.Context, name string, r io.Reader, size int64) error {
	clean, err := CleanPath(name)
	if err != nil {
		return fmt.Errorf("sandbox: write: %w", err)
	}
	if clean == "." {
		return fmt.Errorf("sandbox: write %q: names the workdir itself; name a file: %w", name, ErrPathEscape)
	}
	// The stream may end the command normally whatever the reader said: its verdict is
	// checked here.
	src := &exactReader{r: r, left: size}
	err = s.file(ctx, "write", clean, src, io.Discard)
	if src.err != nil {
		return fmt.Errorf("sandbox: write %s: %w", clean, src.err)
	}
	return err
}

// exactReader passes on exactly the bytes it was told of and remembers why it failed when the
// source fails, ends early or holds more.
type exactReader struct {
	r    io.Reader
	left int64
	err  error
}

func (e *exactReader) Read(p []byte) (int, error) {
	if e.err != nil {
		return 0, e.err
	}
	if e.left == 0 {
		var one [1]byte
		if n, _ := io.ReadFull(e.r, one[:]); n > 0 {
			e.err = fmt.Errorf("the source holds more than it said: %w", ErrTooLarge)
			return 0, e.err
		}
		return 0, io.EOF
	}
	n, err := e.r.Read(p[:min(int64(len(p)), e.left)])
	e.left -= int64(n)
	switch {
	case errors.Is(err, io.EOF) && e.left > 0:
		e.err = fmt.Errorf("the source ended %d bytes early: %w", e.left, io.ErrUnexpectedEOF)
	case err != nil && !errors.Is(err, io.EOF):
		e.err = err
	}
	if e.err != nil {
		return n, e.err
	}
	return n, nil
}

// ReadFile reads a regular file of at most maxBytes from the workdir.
func (s *kubernetesSandbox) ReadFile(ctx context.Context, name string, maxBytes int64) ([]byte, error) {
	clean, err := CleanPath(name)
	if err != nil {
		return nil, fmt.Errorf("sandbox: read: %w", err)
	}
	rc, err := s.open(ctx, "read", clean, maxBytes)
	if err != nil {
		return nil, err
	}
	defer rc.Close()
	return io.ReadAll(rc)
}

// Open streams a regular file of at most maxBytes from the workdir, following no symlink.
func (s *kubernetesSandbox) Open(ctx context.Context, name string, maxBytes int64) (io.ReadCloser, error) {
	clean, err := CleanPath(name)
	if err != nil {
		return nil, fmt.Errorf("sandbox: open: %w", err)
	}
	return s.open(ctx, "open", clean, maxBytes)
}

// open runs fileScript's op, read (ReadFile) or open (Open), whose checks all pass before cat
// starts, with its stdout piped to the reader it returns. It returns once the file's first
// bytes arrive or the script ends: a file the script refuses fails here, not on the first
// Read. The call stays in flight until the reader is closed.
func (s *kubernetesSandbox) open(ctx context.Context, op, clean string, maxBytes int64) (io.ReadCloser, error) {
	rctx, cancel := context.WithCancelCause(ctx)
	id, err := s.begin(cancel)
	if err != nil {
		cancel(nil)
		return nil, fmt.Errorf("sandbox: %s %s: %w", op, clean, err)
	}
	pr, pw := io.Pipe()
	first := &firstWrite{w: pw, arrived: make(chan struct{})}
	done := make(chan struct{})
	var runErr error
	go func() {
		defer close(done)
		runErr = s.fileRun(rctx, op, clean, nil, first, strconv.FormatInt(maxBytes, 10))
		pw.CloseWithError(runErr) // nil: the reader sees EOF after the last byte
	}()
	release := func() {
		pr.Close() // a write still in flight fails, and the stream with it
		cancel(nil)
		<-done
		s.end(id)
	}
	select {
	case <-first.arrived:
	case <-done:
		if runErr != nil {
			release()
			return nil, runErr
		}
	}
	return &streamReader{r: &cappedReader{r: pr, left: maxBytes, op: op, name: clean, max: maxBytes}, ctx: rctx, name: clean, release: release}, nil
}

// firstWrite passes writes on to w and says when the first one comes.
type firstWrite struct {
	w       io.Writer
	arrived chan struct{}
	once    sync.Once
}

func (f *firstWrite) Write(p []byte) (int, error) {
	f.once.Do(func() { close(f.arrived) })
	return f.w.Write(p)
}

// List returns the regular files under dir, recursively, without following symlinks.
func (s *kubernetesSandbox) List(ctx context.Context, dir string) ([]FileInfo, error) {
	clean, err := CleanPath(dir)
	if err != nil {
		return nil, fmt.Errorf("sandbox: list: %w", err)
	}
	out := &cappedBuffer{max: maxListing}
	if err := s.file(ctx, "list", clean, nil, out); err != nil {
		return nil, err
	}
	listing, truncated := out.take()
	if truncated {
		return nil, fmt.Errorf("sandbox: list %s: the listing is over %d bytes; list a subfolder: %w", clean, maxListing, ErrTooLarge)
	}
	// Records: the resolved folder, then "size mode", path pairs; all NUL-terminated.
	fields := strings.Split(string(listing), "\x00")
	if len(fields) < 2 {
		return nil, fmt.Errorf("sandbox: list %s: unexpected answer from the pod", clean)
	}
	base, fields := fields[0], fields[1:len(fields)-1]
	var files []FileInfo
	incomplete := &IncompleteError{Dir: clean}
	for i := 0; i+1 < len(fields); i += 2 {
		if fields[i] == "!" {
			incomplete.add(clean, fields[i+1])
			continue
		}
		rel := strings.TrimPrefix(strings.TrimPrefix(fields[i+1], base), "/")
		var size int64
		var mode uint32
		if _, err := fmt.Sscanf(fields[i], "%d %o", &size, &mode); err != nil || size < 0 {
			// stat failed: the path is too long, or the file went away meanwhile. A size
			// below 0 is no file's: the answer comes from inside the pod, where the job can
			// forge it, and the runner's caps add the sizes up.
			incomplete.add(path.Join(clean, rel), "cannot stat")
			continue
		}
		files = append(files, FileInfo{Path: path.Join(clean, rel), Size: size, Mode: fs.FileMode(mode & 0o777)})
	}
	slices.SortFunc(files, func(a, b FileInfo) int { return strings.Compare(a.Path, b.Path) })
	if len(incomplete.Skipped) > 0 {
		return files, incomplete
	}
	return files, nil
}
