package sandbox

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// bubblewrapSandbox is one job's sandbox: a host folder bound at the workdir, a host uid, a
// cgroup, and the command line every Exec starts from.
type bubblewrapSandbox struct {
	p       *BubblewrapProvider
	id      string
	hostDir string // the workdir on the host; removed on Close
	// scratchDir holds /tmp and /dev/shm where the worker mounts their tmpfs (bubblewrap_disk.go).
	scratchDir string
	// egressDir is bound read-only at egressMount; egressOn says AttachEgress filled it.
	egressDir string
	egressMu  sync.Mutex // guards info against AttachEgress
	egressOn  atomic.Bool
	bridge    *os.File // the egress bridge's copy, held while the sandbox exists (holdBridge)
	image     string
	lock      *sandboxLock // held while any of the sandbox's host state exists
	workdir   string       // the workdir's path inside the sandbox
	wd        *workdir
	disk      diskBound
	uid       int                 // the sandbox's host uid; -1 when the worker is not root
	cred      *syscall.Credential // switches to uid; nil when the worker is not root
	args      []string            // bwrap options shared by every Exec
	etc       []etcFile           // synthesised /etc files, passed from fdEtc on
	cg        *cgroup
	rlimits   []rlimit       // set on each Exec's bwrap before it reads its options
	seccomp   *seccompFilter // the filter of every Exec; nil: none
	info      Info
	log       *slog.Logger
	expiry    *time.Timer
	lifetime  time.Duration // counted from the start, or from the claim of a pool sandbox
	// pollWakeups counts the wake-ups of its commands' disk polls (watchDisk), for tests.
	pollWakeups atomic.Int64

	*calls

	// The spare bwrap of a pool sandbox's first command (bubblewrap_spare.go), started by Warm;
	// spareUsed says the first command came, so no other spare starts.
	pooled    bool // started ahead for a pool (Spec.Pool): only such a sandbox has a spare
	spareMu   sync.Mutex
	spare     *spareBwrap
	spareUsed bool
	spareHit  bool           // a command ran on the spare
	spareGone sync.WaitGroup // spares being discarded in the background

	closeMu sync.Mutex // serialises cleanup between Close and the lifetime timer
	cleaned bool
	wdShut  bool
}

// releaseBridge drops the sandbox's hold on its copy of the egress bridge (holdBridge).
func (s *bubblewrapSandbox) releaseBridge() {
	s.egressMu.Lock()
	defer s.egressMu.Unlock()
	if s.bridge != nil {
		s.bridge.Close()
		s.bridge = nil
	}
}

// cleanup removes the cgroup and the host folder once no call is in flight, and frees the host
// uid. stop (nil: never) abandons the wait; a later Close tries again.
func (s *bubblewrapSandbox) cleanup(stop <-chan struct{}) error {
	s.closeMu.Lock()
	defer s.closeMu.Unlock()
	if s.cleaned {
		return nil
	}
	s.dropSpare()
	select {
	case <-s.idle:
	case <-stop:
		return fmt.Errorf("sandbox: close %s: commands still running; call Close again", s.id)
	}
	var errs []error
	if s.cg != nil {
		if err := s.cg.remove(stop); err != nil {
			errs = append(errs, err)
		}
	}
	if s.wd != nil && !s.wdShut {
		s.wdShut = true
		_ = s.wd.close()
	}
	for _, dir := range []string{s.hostDir, s.scratchDir} {
		if err := removeMount(dir); err != nil {
			errs = append(errs, err)
		}
	}
	if err := os.RemoveAll(s.egressDir); err != nil {
		errs = append(errs, err)
	}
	s.releaseBridge()
	if len(errs) > 0 {
		return fmt.Errorf("sandbox: close %s: %w", s.id, errors.Join(errs...))
	}
	if s.lock != nil {
		if err := s.lock.release(); err != nil {
			// Unlocked, it is removed at the next start of a worker on this Root.
			s.log.Warn("sandbox lock file left behind", "error", err)
		}
		s.lock = nil
	}
	if s.uid >= 0 {
		// Only now: nothing of the sandbox is left to share the uid with its next owner.
		s.p.freeUID(s.uid)
	}
	s.cleaned = true
	return nil
}

// expire ends the sandbox when its lifetime passes, whatever the job is doing.
func (s *bubblewrapSandbox) expire() {
	s.shutdown(fmt.Errorf("sandbox %s: its lifetime passed: %w", s.id, ErrClosed))
	stop := make(chan struct{})
	t := time.AfterFunc(cleanupGrace, func() { close(stop) })
	defer t.Stop()
	if err := s.cleanup(stop); err != nil {
		s.log.Error("sandbox cleanup after lifetime", "error", err)
		return
	}
	s.log.Warn("sandbox removed: lifetime passed")
}

// Close kills every command still running, removes the cgroup and the workdir. It is
// idempotent; if ctx ends before the cleanup is done, a later Close finishes it.
func (s *bubblewrapSandbox) Close(ctx context.Context) error {
	s.expiry.Stop()
	s.shutdown(fmt.Errorf("sandbox %s: %w", s.id, ErrClosed))
	if err := s.cleanup(ctx.Done()); err != nil {
		return err
	}
	s.log.Info("sandbox closed")
	return nil
}

// Info describes the sandbox.
func (s *bubblewrapSandbox) Info() Info {
	s.egressMu.Lock()
	defer s.egressMu.Unlock()
	return s.info
}

// WriteFile creates or replaces a regular file in the workdir, creating parent folders.
func (s *bubblewrapSandbox) WriteFile(ctx context.Context, name string, data []byte) error {
	return s.WriteFrom(ctx, name, bytes.NewReader(data), int64(len(data)))
}

// WriteFrom creates or replaces a regular file in the workdir with exactly size bytes of r.
// The file is renamed into place only once all of them are written.
func (s *bubblewrapSandbox) WriteFrom(ctx context.Context, name string, r io.Reader, size int64) error {
	clean, err := CleanPath(name)
	if err != nil {
		return fmt.Errorf("sandbox: write: %w", err)
	}
	if clean == "." {
		return fmt.Errorf("sandbox: write %q: names the workdir itself; name a file: %w", name, ErrPathEscape)
	}
	id, err := s.begin(nil)
	if err != nil {
		return fmt.Errorf("sandbox: write %s: %w", clean, err)
	}
	defer s.end(id)
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("sandbox: write %s: %w", clean, err)
	}
	return s.lost("write "+clean, s.wd.writeFrom(clean, &ctxReader{ctx: ctx, r: r}, size, s.disk))
}

// ctxReader stops a long copy once ctx ends.
type ctxReader struct {
	ctx context.Context
	r   io.Reader
}

func (c *ctxReader) Read(p []byte) (int, error) {
	if err := c.ctx.Err(); err != nil {
		return 0, err
	}
	return c.r.Read(p)
}

// ReadFile reads a regular file of at most maxBytes from the workdir.
func (s *bubblewrapSandbox) ReadFile(ctx context.Context, name string, maxBytes int64) ([]byte, error) {
	clean, err := CleanPath(name)
	if err != nil {
		return nil, fmt.Errorf("sandbox: read: %w", err)
	}
	id, err := s.begin(nil)
	if err != nil {
		return nil, fmt.Errorf("sandbox: read %s: %w", clean, err)
	}
	defer s.end(id)
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("sandbox: read %s: %w", clean, err)
	}
	data, err := s.wd.readFile(clean, maxBytes)
	if err = s.lost("read "+clean, err); err != nil {
		return nil, err
	}
	return data, nil
}

// Open opens a regular file of at most maxBytes in the workdir as a stream, following no
// symlink: the lookup refuses one anywhere on the path (RESOLVE_NO_SYMLINKS), inside the
// workdir or not.
func (s *bubblewrapSandbox) Open(ctx context.Context, name string, maxBytes int64) (io.ReadCloser, error) {
	clean, err := CleanPath(name)
	if err != nil {
		return nil, fmt.Errorf("sandbox: open: %w", err)
	}
	rctx, cancel := context.WithCancelCause(ctx)
	id, err := s.begin(cancel)
	if err != nil {
		cancel(nil)
		return nil, fmt.Errorf("sandbox: open %s: %w", clean, err)
	}
	var (
		f *os.File
		r io.Reader
	)
	if err = rctx.Err(); err != nil {
		err = fmt.Errorf("sandbox: open %s: %w", clean, err)
	} else {
		f, r, err = s.wd.open("open", clean, maxBytes, resolveInside|unix.RESOLVE_NO_SYMLINKS)
	}
	if err = s.lost("open "+clean, err); err != nil {
		if f != nil {
			f.Close()
		}
		cancel(nil)
		s.end(id)
		return nil, err
	}
	// A read in flight when the sandbox shuts down or ctx ends fails at once.
	stop := context.AfterFunc(rctx, func() { f.Close() })
	return &streamReader{r: r, ctx: rctx, name: clean, release: func() {
		stop()
		f.Close()
		cancel(nil)
		s.end(id)
	}}, nil
}

// List returns the regular files under dir, recursively, without following symlinks.
func (s *bubblewrapSandbox) List(ctx context.Context, dir string) ([]FileInfo, error) {
	clean, err := CleanPath(dir)
	if err != nil {
		return nil, fmt.Errorf("sandbox: list: %w", err)
	}
	id, err := s.begin(nil)
	if err != nil {
		return nil, fmt.Errorf("sandbox: list %s: %w", clean, err)
	}
	defer s.end(id)
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("sandbox: list %s: %w", clean, err)
	}
	// A removed folder lists as empty: no error would tell.
	files, err := s.wd.list(clean)
	if lost := s.lost("list "+clean, err); lost != err { //nolint:errorlint // identity: lost returns err itself when the sandbox is there
		return nil, lost
	}
	return files, err
}
