package sandbox

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"sort"
	"strings"

	"golang.org/x/sys/unix"
)

// resolveInside keeps a lookup beneath the workdir: the kernel refuses absolute symlinks, ".."
// that climbs out, and /proc magic links, whatever the sandbox has put in the folder meanwhile.
// This is checked during the lookup itself (openat2), so there is no window between a check and
// the use in which a sandboxed process could swap a folder for a symlink.
const resolveInside = unix.RESOLVE_BENEATH | unix.RESOLVE_NO_MAGICLINKS

// workdir is the host side of a sandbox's writable folder. The worker reads and writes it while
// sandboxed processes may be changing it, so every path is resolved with openat2 relative to a
// handle on the folder, never as a host path string.
type workdir struct {
	fd *os.File // O_PATH handle on the folder
	// uid and gid own what the worker creates, so the sandbox can change it later; -1 leaves
	// the worker as owner (the worker is then the sandbox's user anyway).
	uid, gid int
	// ownFS is true when the folder is a filesystem of its own (bubblewrap_disk.go), whose use
	// statfs reads; otherwise usage walks the tree.
	ownFS bool
}

func openWorkdir(dir string, uid, gid int, ownFS bool) (*workdir, error) {
	fd, err := unix.Open(dir, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC|unix.O_NOFOLLOW, 0)
	if err != nil {
		return nil, fmt.Errorf("open workdir %s: %w", dir, err)
	}
	w := &workdir{fd: os.NewFile(uintptr(fd), dir), uid: uid, gid: gid, ownFS: ownFS}
	// openat2 arrived in Linux 5.6; without it nothing here can be confined safely.
	probe, err := w.openat(fd, ".", unix.O_RDONLY|unix.O_DIRECTORY, 0, resolveInside)
	if err != nil {
		w.fd.Close()
		if errors.Is(err, unix.ENOSYS) {
			return nil, fmt.Errorf("openat2 is missing (Linux 5.6 or later is needed to confine file access to the workdir): %w", ErrUnavailable)
		}
		return nil, fmt.Errorf("open workdir %s: %w", dir, err)
	}
	unix.Close(probe)
	return w, nil
}

func (w *workdir) close() error { return w.fd.Close() }

// openat wraps openat2, retrying the EAGAIN the kernel returns when a rename races a
// RESOLVE_BENEATH lookup.
func (w *workdir) openat(dirfd int, name string, flags int, mode uint32, resolve uint64) (int, error) {
	how := unix.OpenHow{Flags: uint64(flags | unix.O_CLOEXEC), Mode: uint64(mode), Resolve: resolve}
	for range 16 {
		fd, err := unix.Openat2(dirfd, name, &how)
		if err != unix.EAGAIN && err != unix.EINTR {
			return fd, err
		}
	}
	return -1, unix.EAGAIN
}

// pathError turns a lookup failure into the package's sentinels, by pathClasses; the errno of
// any other is wrapped as it is, for the caller to class.
func pathError(op, name string, err error) error {
	for _, c := range pathClasses {
		for _, e := range c.errs {
			if errors.Is(err, e) {
				words := c.words
				if c.sayErr {
					words = err.Error() + ": "
				}
				return fmt.Errorf("sandbox: %s %s: %s%w", op, name, words, c.class)
			}
		}
	}
	return fmt.Errorf("sandbox: %s %s: %w", op, name, err)
}

// pathClasses are the lookup failures the package has a sentinel for, first match wins: both
// backends' file operations class an errno here (a pod's through podErrnos).
var pathClasses = []struct {
	errs   []error
	class  error
	words  string // before the class's own
	sayErr bool   // the error's own text instead
}{
	{errs: []error{ErrNotDir}, class: ErrNotDir, words: "read a file with ReadFile: "},
	{errs: []error{unix.ENOENT, unix.ENOTDIR}, class: ErrNotFound},
	{errs: []error{unix.EXDEV}, class: ErrPathEscape, words: "a symlink or .. leads out of the workdir: "},
	{errs: []error{unix.ELOOP}, class: ErrPathEscape, words: "symlink loop or /proc magic link: "},
	{errs: []error{unix.EDQUOT, unix.ENOSPC}, class: ErrDiskFull, sayErr: true},
	{errs: []error{unix.EISDIR}, class: errIsFolder},
}

// open opens a regular file of at most maxBytes for reading, resolved as resolve says
// (resolveInside, or with RESOLVE_NO_SYMLINKS too for Open). It opens without blocking so that
// a FIFO planted under the expected name cannot hang the worker, then insists on a regular
// file. Reads through the returned reader fail with ErrTooLarge past maxBytes: the file may
// grow after the fstat here.
func (w *workdir) open(op, name string, maxBytes int64, resolve uint64) (*os.File, io.Reader, error) {
	fd, err := w.openat(int(w.fd.Fd()), name, unix.O_RDONLY|unix.O_NONBLOCK|unix.O_NOCTTY, 0, resolve)
	if err != nil {
		if errors.Is(err, unix.ELOOP) && resolve&unix.RESOLVE_NO_SYMLINKS != 0 {
			return nil, nil, fmt.Errorf("sandbox: %s %s: a symlink is on the way and %s follows none: %w", op, name, op, ErrPathEscape)
		}
		return nil, nil, pathError(op, name, err)
	}
	f := os.NewFile(uintptr(fd), name)
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		f.Close()
		return nil, nil, pathError(op, name, err)
	}
	if err := regular(st.Mode); err != nil {
		f.Close()
		return nil, nil, fmt.Errorf("sandbox: %s %s: %w", op, name, err)
	}
	if st.Size > maxBytes {
		f.Close()
		return nil, nil, fmt.Errorf("sandbox: %s %s: %d bytes, more than the %d allowed: %w", op, name, st.Size, maxBytes, ErrTooLarge)
	}
	if err := unix.SetNonblock(fd, false); err != nil {
		f.Close()
		return nil, nil, pathError(op, name, err)
	}
	return f, &cappedReader{r: f, left: maxBytes, op: op, name: name, max: maxBytes}, nil
}

// readFile reads a regular file of at most maxBytes, following symlinks that stay inside.
func (w *workdir) readFile(name string, maxBytes int64) ([]byte, error) {
	f, r, err := w.open("read", name, maxBytes, resolveInside)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	data, err := io.ReadAll(r)
	if err != nil {
		if errors.Is(err, ErrTooLarge) {
			return nil, err
		}
		return nil, pathError("read", name, err)
	}
	return data, nil
}

func regular(mode uint32) error {
	switch mode & unix.S_IFMT {
	case unix.S_IFREG:
		return nil
	case unix.S_IFDIR:
		return errIsFolder
	default:
		return errNotRegular
	}
}

// writeFrom replaces name with a new regular file holding exactly size bytes streamed from r:
// a reader that fails, ends early or holds more fails the write, and the file is not put in
// place. It writes a temporary file next to it and renames it into place, so a symlink, FIFO or
// hard link already at name is replaced rather than written through. bound bounds the
// workdir's total usage (zero: none).
func (w *workdir) writeFrom(name string, r io.Reader, size int64, bound diskBound) error {
	dir, base := path.Split(name)
	dfd, err := w.mkdirAll(strings.TrimSuffix(dir, "/"))
	if err != nil {
		return err
	}
	defer unix.Close(dfd)
	if err := w.checkBound(dfd, base, name, size, bound); err != nil {
		return err
	}
	var suffix [8]byte
	_, _ = rand.Read(suffix[:])
	tmp := ".boxcar-write-" + hex.EncodeToString(suffix[:])
	fd, err := w.openat(dfd, tmp, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW, 0o644, resolveInside)
	if err != nil {
		return pathError("write", name, err)
	}
	err = w.fill(os.NewFile(uintptr(fd), tmp), r, size)
	if err == nil {
		err = unix.Renameat(dfd, tmp, dfd, base)
	}
	if err != nil {
		_ = unix.Unlinkat(dfd, tmp, 0)
		if errors.Is(err, unix.EISDIR) || errors.Is(err, unix.ENOTEMPTY) || errors.Is(err, unix.EEXIST) {
			return fmt.Errorf("sandbox: write %s: a folder has that name; choose another name: %w", name, errIsFolder)
		}
		return pathError("write", name, err)
	}
	return nil
}

// checkBound fails with ErrDiskFull when replacing base in the folder dfd (name in the workdir)
// with size bytes would take the workdir over bound.
func (w *workdir) checkBound(dfd int, base, name string, size int64, bound diskBound) error {
	if bound.bytes <= 0 {
		return nil
	}
	used, err := w.usage()
	if err != nil {
		// A workdir that cannot be measured counts as full.
		return fmt.Errorf("sandbox: write %s: cannot measure the workdir (%v), so it counts as over its disk bound; remove files first: %w", name, err, ErrDiskFull)
	}
	var st unix.Stat_t
	if unix.Fstatat(dfd, base, &st, unix.AT_SYMLINK_NOFOLLOW) == nil && st.Mode&unix.S_IFMT == unix.S_IFREG {
		used.bytes -= st.Blocks * 512
		used.inodes--
	}
	need := diskUse{bytes: used.bytes + roundBlock(size), inodes: used.inodes + 1}
	if need.over(bound) {
		return fmt.Errorf("sandbox: write %s: the workdir would hold %d bytes in %d files and folders, over its bound of %d bytes and %d inodes; remove files first: %w",
			name, need.bytes, need.inodes, bound.bytes, bound.inodes, ErrDiskFull)
	}
	return nil
}

// fill writes exactly size bytes of r to f, a new file, gives it to the sandbox's user and
// closes it.
func (w *workdir) fill(f *os.File, r io.Reader, size int64) error {
	err := copyExactly(f, r, size)
	if err == nil && w.uid >= 0 {
		err = unix.Fchown(int(f.Fd()), w.uid, w.gid)
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}

// copyExactly copies exactly size bytes of r to f, failing when r fails, ends early or holds
// more.
func copyExactly(f io.Writer, r io.Reader, size int64) error {
	n, err := io.Copy(f, io.LimitReader(r, size))
	switch {
	case err != nil:
		return err
	case n < size:
		return fmt.Errorf("the source ended after %d of its %d bytes: %w", n, size, io.ErrUnexpectedEOF)
	}
	var one [1]byte
	if m, err := io.ReadFull(r, one[:]); m > 0 {
		return fmt.Errorf("the source holds more than its %d bytes: %w", size, ErrTooLarge)
	} else if err != nil && !errors.Is(err, io.EOF) {
		return err
	}
	return nil
}

func roundBlock(n int64) int64 { return (n + 4095) &^ 4095 }

// mkdirAll makes the folder rel and its parents, each created by a single-component mkdirat in
// a folder already resolved beneath the workdir, and returns a handle on it.
func (w *workdir) mkdirAll(rel string) (int, error) {
	root := int(w.fd.Fd())
	cur, err := w.openat(root, ".", unix.O_RDONLY|unix.O_DIRECTORY, 0, resolveInside)
	if err != nil {
		return -1, pathError("write", rel, err)
	}
	if rel == "" || rel == "." {
		return cur, nil
	}
	parts := strings.Split(rel, "/")
	for i, part := range parts {
		made := unix.Mkdirat(cur, part, 0o755) == nil
		next, err := w.openat(root, strings.Join(parts[:i+1], "/"), unix.O_RDONLY|unix.O_DIRECTORY, 0, resolveInside)
		unix.Close(cur)
		if err != nil {
			return -1, pathError("write", rel, err)
		}
		cur = next
		if made && w.uid >= 0 {
			if err := unix.Fchown(cur, w.uid, w.gid); err != nil {
				unix.Close(cur)
				return -1, pathError("write", rel, err)
			}
		}
	}
	return cur, nil
}

// list returns the regular files under dir, paths relative to the workdir, sorted. What it
// holds, paths and the folders still to read, stays within maxListing: past it, it stops and
// fails with ErrTooLarge, as a pod's listing does.
func (w *workdir) list(dir string) ([]FileInfo, error) {
	fd, err := w.openat(int(w.fd.Fd()), dir, unix.O_RDONLY|unix.O_DIRECTORY, 0, resolveInside)
	if errors.Is(err, unix.ENOTDIR) {
		// Either dir itself is no folder, or a folder on the way to it is not (then dir
		// does not exist). Only the first is ErrNotDir.
		err = w.notDir(dir)
	}
	if err != nil {
		return nil, pathError("list", dir, err)
	}
	defer unix.Close(fd)
	var files []FileInfo
	incomplete := &IncompleteError{Dir: dir}
	err = walk(fd, func(rel string, st *unix.Stat_t) int64 {
		if st.Mode&unix.S_IFMT != unix.S_IFREG {
			return 0
		}
		f := FileInfo{Path: path.Join(dir, rel), Size: st.Size, Mode: fs.FileMode(st.Mode & 0o777)}
		files = append(files, f)
		return int64(len(f.Path)) + listingRecord
	}, func(rel string, err error) {
		incomplete.add(path.Join(dir, rel), unreadableReason(err))
	})
	if errors.Is(err, ErrTooLarge) {
		return nil, fmt.Errorf("sandbox: list %s: the listing is over %d bytes; list a subfolder: %w", dir, maxListing, ErrTooLarge)
	}
	if err != nil {
		return nil, fmt.Errorf("sandbox: list %s: %w", dir, err)
	}
	sort.Slice(files, func(i, j int) bool { return files[i].Path < files[j].Path })
	if len(incomplete.Skipped) > 0 {
		return files, incomplete
	}
	return files, nil
}

// unreadableReason says in a few words why a folder could not be read.
func unreadableReason(err error) string {
	switch {
	case errors.Is(err, unix.ENAMETOOLONG):
		return "nested past PATH_MAX"
	case errors.Is(err, unix.EACCES), errors.Is(err, unix.EPERM):
		return "no permission"
	}
	return unix.ErrnoName(errno(err))
}

func errno(err error) unix.Errno {
	var e unix.Errno
	if errors.As(err, &e) {
		return e
	}
	return 0
}

// notDir says why dir, which cannot be opened as a folder, is not one: ErrNotDir when it
// resolves (inside the workdir) to something else, else the lookup's own failure.
func (w *workdir) notDir(dir string) error {
	fd, err := w.openat(int(w.fd.Fd()), dir, unix.O_PATH, 0, resolveInside)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return err
	}
	if st.Mode&unix.S_IFMT == unix.S_IFDIR {
		return unix.EAGAIN // swapped for a folder meanwhile; the caller may list again
	}
	return ErrNotDir
}

// usage is the disk space the workdir takes, as du counts it (allocated blocks), and the
// inodes it uses. On a filesystem of its own, statfs says; otherwise the tree is walked, which
// cannot see files unlinked while open and fails on a tree nested past PATH_MAX or one whose
// folders waiting to be read name more than maxListing bytes: callers count a failure as over
// the bound.
func (w *workdir) usage() (diskUse, error) {
	if w.ownFS {
		return statfsUse(int(w.fd.Fd()))
	}
	u := diskUse{inodes: 1}
	err := walk(int(w.fd.Fd()), func(_ string, st *unix.Stat_t) int64 {
		u.bytes += st.Blocks * 512
		u.inodes++
		return 0
	}, nil)
	return u, err
}

// walkBatch is how many names of a folder the walk reads at once: a folder of millions of
// entries is never held whole.
const walkBatch = 1024

// walk visits everything beneath the folder base without following any symlink: each folder is
// reopened from base with RESOLVE_NO_SYMLINKS, so a folder swapped for a symlink mid-walk is
// skipped instead of followed, and only one folder handle is open at a time however deep the
// tree is. A folder beneath base that cannot be read (nested past PATH_MAX, no permission)
// fails the walk when skip is nil; otherwise skip is told and the walk goes on without it.
//
// visit returns how many bytes it keeps of what it was shown. What the walk holds, the paths of
// the folders it has yet to read, counts too, and the walk stops with ErrTooLarge once the two
// together pass maxListing: the job decides how many files and folders there are, and how long
// their paths.
func walk(base int, visit func(rel string, st *unix.Stat_t) int64, skip func(rel string, err error)) error {
	w := &walker{base: base, visit: visit, skip: skip, queue: []string{"."}}
	for len(w.queue) > 0 {
		dir := w.queue[0]
		w.queue = w.queue[1:]
		w.held -= int64(len(dir))
		if err := w.folder(dir); err != nil {
			return err
		}
	}
	return nil
}

// walker is one walk's state.
type walker struct {
	base  int
	visit func(rel string, st *unix.Stat_t) int64
	skip  func(rel string, err error)
	queue []string // folders to read, relative to base
	held  int64    // bytes visit kept, and the paths in queue
}

// folder visits the entries of dir, a batch of names at a time, and queues its folders.
func (w *walker) folder(dir string) error {
	fd, err := unix.Openat2(w.base, dir, &unix.OpenHow{
		Flags:   unix.O_RDONLY | unix.O_DIRECTORY | unix.O_CLOEXEC | unix.O_NOFOLLOW,
		Resolve: unix.RESOLVE_BENEATH | unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS,
	})
	if err != nil {
		if dir != "." && (errors.Is(err, unix.ENOENT) || errors.Is(err, unix.ENOTDIR) || errors.Is(err, unix.ELOOP) || errors.Is(err, unix.EXDEV) || errors.Is(err, unix.EAGAIN)) {
			return nil // changed under us by a running command: it is no longer a folder here
		}
		return w.unreadable(dir, fmt.Errorf("open %s: %w", dir, err))
	}
	f := os.NewFile(uintptr(fd), dir)
	defer f.Close()
	for {
		names, err := f.Readdirnames(walkBatch)
		for _, name := range names {
			if err := w.entry(fd, dir, name); err != nil {
				return err
			}
		}
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return w.unreadable(dir, fmt.Errorf("read folder %s: %w", dir, err))
		}
	}
}

// entry visits one name of the folder fd (dir) and queues it if it is a folder.
func (w *walker) entry(fd int, dir, name string) error {
	var st unix.Stat_t
	if err := unix.Fstatat(fd, name, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return nil // removed meanwhile
	}
	rel := path.Join(dir, name)
	w.held += w.visit(rel, &st)
	if st.Mode&unix.S_IFMT == unix.S_IFDIR {
		w.queue = append(w.queue, rel)
		w.held += int64(len(rel))
	}
	if w.held > maxListing {
		return fmt.Errorf("the walk would hold more than %d bytes of paths: %w", maxListing, ErrTooLarge)
	}
	return nil
}

// unreadable tells skip of a folder the walk cannot read, or fails the walk with err when
// there is no skip or the folder is base itself.
func (w *walker) unreadable(dir string, err error) error {
	if dir == "." || w.skip == nil {
		return err
	}
	w.skip(dir, err)
	return nil
}

// removeTree removes a sandbox's host folder. A job may leave folders without write
// permission; root ignores that, anyone else first has to give the permission back. Nothing
// runs in the sandbox any more, but the pass still goes through an os.Root so that no symlink
// the job left can send a chmod outside the folder.
func removeTree(dir string) error {
	err := os.RemoveAll(dir)
	if err == nil || os.Geteuid() == 0 {
		return err
	}
	if r, err := os.OpenRoot(dir); err == nil {
		_ = r.Chmod(".", 0o700)
		_ = fs.WalkDir(r.FS(), ".", func(name string, d fs.DirEntry, err error) error {
			if err == nil && d.IsDir() {
				_ = r.Chmod(name, 0o700) // before WalkDir reads it
			}
			return nil
		})
		r.Close()
	}
	return os.RemoveAll(dir)
}
