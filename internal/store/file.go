package store

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"
)

// tempPrefix starts the names of the file backend's temporary files. They live next to the
// object they become, List never shows them, and keys may not use the prefix.
const tempPrefix = ".boxcar-tmp-"

// File is the file backend: each object is a regular file under one local directory, written
// to a temporary file, synced and then renamed (Put) or hard-linked (PutIfAbsent) into place,
// so a reader never sees a partial object. All access goes through an os.Root, so neither a
// key nor a symbolic link can reach outside the directory.
//
// A key cannot be both an object and a folder of other objects ("a" and "a/b"), which S3
// allows; the run layout never does that.
//
// A store directory with the setgid bit is a folder shared by a group (a volume with an
// fsGroup, or a worker and its submitters as different users): its folders are made group-
// writable and setgid as well, whatever the umask, so that a folder one user made (a tenant's,
// by the first submit) takes the other's objects too.
type File struct {
	dir    string
	root   *os.Root
	shared bool
	writes writeProofs // of the tenants' folders: see proveWrites
	probe  storeProof  // of the store's own object: a proof that took, never a refusal
}

var _ Store = (*File)(nil)

// NewFile opens the store kept in dir, creating the directory if it is missing. Close releases
// the directory handle.
func NewFile(dir string) (*File, error) {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return nil, fmt.Errorf("store: file %s: %w", dir, err)
	}
	if err := os.MkdirAll(abs, 0o750); err != nil {
		return nil, fmt.Errorf("store: file %s: %w", abs, err)
	}
	root, err := os.OpenRoot(abs)
	if err != nil {
		return nil, fmt.Errorf("store: file %s: %w", abs, err)
	}
	info, err := root.Stat(".")
	if err != nil {
		root.Close()
		return nil, fmt.Errorf("store: file %s: %w", abs, err)
	}
	return &File{dir: abs, root: root, shared: info.Mode()&os.ModeSetgid != 0}, nil
}

func (f *File) writeProofs() (*writeProofs, time.Duration) { return &f.writes, defaultProbeInterval }

// remedy says whose the folder must be.
func (f *File) remedy(folder string) string {
	return fmt.Sprintf("no job of the tenant can be committed there. Let the worker's user write %s and what is under it (its owner, group or mode), or mount the store read-write", filepath.Join(f.dir, filepath.FromSlash(folder)))
}

// keyRemedy says whose the key's file and folder must be.
func (f *File) keyRemedy(key string) string {
	return fmt.Sprintf("Let the worker's user write %s and its folder (their owner, group or mode)", filepath.Join(f.dir, filepath.FromSlash(key)))
}

// keyRefuser names the modes and owners of the key's folders: a file store has no policies.
func (f *File) keyRefuser(every bool) string {
	if every {
		return fmt.Sprintf("the mode or owner of a folder under %s, outside any tenant's folder too,", filepath.Join(f.dir, "tenants"))
	}
	return "the mode or owner of this key's file or folders under the tenant's folder alone"
}

// Close releases the directory handle. The store cannot be used afterwards.
func (f *File) Close() error { return f.root.Close() }

// Put writes an object, replacing any previous one atomically. When size is not -1 the body
// must hold exactly size bytes, otherwise nothing is written.
func (f *File) Put(ctx context.Context, key string, r io.Reader, size int64) error {
	if err := f.put(ctx, key, r, size, false); err != nil {
		return fmt.Errorf("store: put %s: %w", key, f.probe.refusedWhere(ctx, key, err, refusedWrite(err), f.Probe))
	}
	return nil
}

// PutIfAbsent writes an object only if none exists under key, otherwise it returns an error
// wrapping ErrExists and leaves the existing object alone. Of concurrent writers exactly one
// wins.
func (f *File) PutIfAbsent(ctx context.Context, key string, r io.Reader, size int64) error {
	if err := f.put(ctx, key, r, size, true); err != nil {
		return fmt.Errorf("store: put-if-absent %s: %w", key, f.probe.refusedWhere(ctx, key, err, refusedWrite(err), f.Probe))
	}
	return nil
}

// Probe proves that the worker may write the store's directory, by a create-only put of the
// store's own object (ProbeKey), as the S3 store proves its server: a directory that refuses
// it (mounted read-only, not the worker's user's) refuses every tenant, the worker's refusal
// (ErrWorkerRefused: the worker is not ready, and its attempts wait), where each tenant's
// proof of writes took it for that tenant's folder and failed its jobs. A proof that took
// holds for a minute; a refusal or another fault holds for nobody.
func (f *File) Probe(ctx context.Context) error {
	return f.probe.hold(defaultProbeInterval, func() (bool, error) {
		switch err := f.put(ctx, ProbeKey, bytes.NewReader(probeBody), int64(len(probeBody)), true); {
		case err == nil, errors.Is(err, ErrExists):
			return true, nil
		case refusedWrite(err):
			err = &refusal{err: err, by: byStore, why: fmt.Sprintf("the worker cannot write the store's directory %s, so no tenant's run: mount it read-write, or let the worker's user write it and what is under it (its owner, group or mode)", f.dir)}
			return false, fmt.Errorf("store: prove writes on %s: %w", f.URL(ProbeKey), err)
		default:
			return false, fmt.Errorf("store: prove writes on %s: %w", f.URL(ProbeKey), err)
		}
	})
}

func (f *File) put(ctx context.Context, key string, r io.Reader, size int64, ifAbsent bool) error {
	if err := checkKey(key); err != nil {
		return err
	}
	if !WritableKey(key) {
		return fmt.Errorf("%w %q: a key the store writes has no control character, nor U+FFFE or U+FFFF", ErrInvalidKey, key)
	}
	if size < -1 {
		return fmt.Errorf("size %d: must be -1 (unknown) or at least 0", size)
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	dir := path.Dir(key)
	tmp := path.Join(dir, tempPrefix+randomHex())
	w, err := f.createIn(dir, tmp)
	if err != nil {
		return err
	}
	defer func() {
		if w != nil {
			w.Close()
		}
		// After a rename there is nothing left to remove; after a link or a failure the
		// temporary name goes. A process killed before this leaves it: List never shows it,
		// and `submit gc` discards it (Partials).
		_ = f.root.Remove(tmp)
	}()
	if err := copyBody(ctx, w, r, size); err != nil {
		return err
	}
	if err := w.Sync(); err != nil {
		return err
	}
	closeErr := w.Close()
	w = nil
	if closeErr != nil {
		return closeErr
	}
	if ifAbsent {
		// link(2) fails with EEXIST atomically when the name is taken, and the object appears
		// whole: its data was synced before it got the name.
		if err := f.root.Link(tmp, key); err != nil {
			if errors.Is(err, fs.ErrExist) {
				if info, statErr := f.root.Lstat(key); statErr == nil && info.IsDir() {
					return fmt.Errorf("%s is a folder of other objects", key)
				}
				return ErrExists
			}
			return err
		}
	} else if err := f.root.Rename(tmp, key); err != nil {
		return err
	}
	return f.syncDir(dir)
}

// createIn makes dir and the temporary file tmp in it. `submit gc` prunes empty folders
// (PruneFolders): one it removed between the two is made again.
func (f *File) createIn(dir, tmp string) (*os.File, error) {
	for try := 0; ; try++ {
		if err := f.mkdirAll(dir); err != nil {
			return nil, notFolder(err)
		}
		w, err := f.root.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o640)
		if err == nil || try == 2 || !errors.Is(err, fs.ErrNotExist) {
			return w, err
		}
	}
}

// copyBody copies r to w, stopping when ctx is done, and checks the length against size
// unless size is -1.
func copyBody(ctx context.Context, w io.Writer, r io.Reader, size int64) error {
	src := io.Reader(ctxReader{ctx: ctx, r: r})
	if size >= 0 {
		// Read one byte past size to notice a body that is too long.
		src = io.LimitReader(src, size+1)
	}
	n, err := io.Copy(w, src)
	if err != nil {
		return err
	}
	if size >= 0 && n != size {
		return sizeMismatch(n, size)
	}
	return nil
}

func sizeMismatch(n, size int64) error {
	if n > size {
		return fmt.Errorf("body is longer than the declared size %d", size)
	}
	return fmt.Errorf("body has %d bytes, the declared size is %d", n, size)
}

// syncDir makes a new name in dir durable.
func (f *File) syncDir(dir string) error {
	d, err := f.root.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}

// Get opens an object; the error wraps ErrNotFound when there is none.
func (f *File) Get(ctx context.Context, key string) (io.ReadCloser, error) {
	if err := checkKey(key); err != nil {
		return nil, fmt.Errorf("store: get %s: %w", key, err)
	}
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("store: get %s: %w", key, err)
	}
	r, err := f.root.Open(key)
	if err != nil {
		return nil, fmt.Errorf("store: get %s: %w", key, f.readRefusedWhere(ctx, key, notFound(err)))
	}
	info, err := r.Stat()
	if err != nil {
		r.Close()
		return nil, fmt.Errorf("store: get %s: %w", key, err)
	}
	if !info.Mode().IsRegular() {
		r.Close()
		return nil, fmt.Errorf("store: get %s: %w", key, ErrNotFound)
	}
	return r, nil
}

// readRefusedWhere tells whose the refusal of a read of key (err, for want of permission: a
// mode, an owner) is, as the S3 store's does a policy's: the directory proven again refusing
// the worker's writes is the worker's; the store's own object (ProbeKey) refused to the worker
// too, every tenant's reads are, the worker's (ErrWorkerRefused); read, this key alone is
// (ErrReadRefused: its file's or folders' modes). A proof that cannot tell keeps err.
func (f *File) readRefusedWhere(ctx context.Context, key string, err error) error {
	if !errors.Is(err, fs.ErrPermission) || !f.probe.mine(key) {
		return err
	}
	if werr := f.probe.refusedWhere(ctx, key, err, true, f.Probe); errors.Is(werr, ErrWorkerRefused) {
		return werr
	}
	switch rerr := f.readAgain(ctx, ProbeKey); {
	case errors.Is(rerr, ErrReadRefused):
		return &refusal{err: err, by: byStore, why: fmt.Sprintf("the worker cannot read the store's own object %s either, so no tenant's inputs or runs: let the worker's user read %s and what is under it (its owner, group or mode)", f.URL(ProbeKey), f.dir)}
	case rerr != nil:
		return err
	}
	return fmt.Errorf("%w: %w; the worker reads the store's own %s, not this file: let the worker's user read %s and its folders (their owner, group or mode)",
		ErrReadRefused, err, f.URL(ProbeKey), filepath.Join(f.dir, filepath.FromSlash(key)))
}

// readAgain opens key and closes it, its refusal for want of permission ErrReadRefused,
// without proving the store again (see the S3 store's).
func (f *File) readAgain(ctx context.Context, key string) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	r, err := f.root.Open(key)
	switch {
	case errors.Is(err, fs.ErrPermission):
		return fmt.Errorf("store: get %s: %w: %w", key, ErrReadRefused, err)
	case err != nil:
		return fmt.Errorf("store: get %s: %w", key, notFound(err))
	}
	return r.Close()
}

// Stat returns an object's size, content type and modification time; the error wraps
// ErrNotFound when there is none.
func (f *File) Stat(ctx context.Context, key string) (ObjectInfo, error) {
	if err := checkKey(key); err != nil {
		return ObjectInfo{}, fmt.Errorf("store: stat %s: %w", key, err)
	}
	if err := ctx.Err(); err != nil {
		return ObjectInfo{}, fmt.Errorf("store: stat %s: %w", key, err)
	}
	info, err := f.root.Stat(key)
	if err != nil {
		return ObjectInfo{}, fmt.Errorf("store: stat %s: %w", key, f.readRefusedWhere(ctx, key, notFound(err)))
	}
	if !info.Mode().IsRegular() {
		return ObjectInfo{}, fmt.Errorf("store: stat %s: %w", key, ErrNotFound)
	}
	// A plain file has no metadata: its content type is derived from the key, as the s3
	// backend stores it.
	return ObjectInfo{Key: key, Size: info.Size(), ContentType: ContentType(key), ModTime: info.ModTime()}, nil
}

// Delete removes an object; there being none is not an error. Folders it leaves empty stay:
// List does not show them, a later Put reuses them, and PruneFolders removes them.
func (f *File) Delete(ctx context.Context, key string) error {
	if err := checkKey(key); err != nil {
		return fmt.Errorf("store: delete %s: %w", key, err)
	}
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("store: delete %s: %w", key, err)
	}
	info, err := f.root.Lstat(key)
	switch {
	case errors.Is(notFound(err), ErrNotFound):
		return nil
	case err != nil:
		return fmt.Errorf("store: delete %s: %w", key, err)
	case !info.Mode().IsRegular():
		return nil // not an object: a folder of other objects
	}
	if err := f.root.Remove(key); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("store: delete %s: %w", key, err)
	}
	return nil
}

// List returns the objects whose keys start with prefix, sorted by key, with their size and
// mtime. prefix is "" (everything), a folder ("runs/x/") or the start of a key ("runs/x/rep").
func (f *File) List(ctx context.Context, prefix string) ([]ObjectInfo, error) {
	if err := checkPrefix(prefix); err != nil {
		return nil, fmt.Errorf("store: list %s: %w", prefix, err)
	}
	objects, _, err := f.walk(ctx, prefix, false, -1)
	if err != nil {
		return nil, fmt.Errorf("store: list %s: %w", prefix, err)
	}
	return objects, nil
}

// ListAtMost is List of the first n objects the walk meets under prefix, and whether there
// are more (see the package's ListAtMost).
func (f *File) ListAtMost(ctx context.Context, prefix string, n int) ([]ObjectInfo, bool, error) {
	if err := checkPrefix(prefix); err != nil {
		return nil, false, fmt.Errorf("store: list %s: %w", prefix, err)
	}
	objects, more, err := f.walk(ctx, prefix, false, max(n, 0))
	if err != nil {
		return nil, false, fmt.Errorf("store: list %s: %w", prefix, err)
	}
	return objects, more, nil
}

// walk returns the regular files whose keys start with prefix, sorted by key: the objects, or
// with temp the temporary files of puts, which are no objects. It stops at the n+1th (n < 0:
// never), and more says it met one.
func (f *File) walk(ctx context.Context, prefix string, temp bool, n int) (objects []ObjectInfo, more bool, err error) {
	start := "."
	if i := strings.LastIndexByte(prefix, '/'); i >= 0 {
		start = prefix[:i]
	}
	objects = []ObjectInfo{}
	err = fs.WalkDir(f.root.FS(), start, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			if p == start && (errors.Is(err, fs.ErrNotExist) || errors.Is(err, syscall.ENOTDIR)) {
				return fs.SkipAll // nothing under this prefix
			}
			return err
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		// The probe object is the store's own, not one of the caller's.
		if strings.HasPrefix(d.Name(), tempPrefix) != temp || !d.Type().IsRegular() || !strings.HasPrefix(p, prefix) || p == ProbeKey {
			return nil
		}
		info, err := d.Info()
		if errors.Is(err, fs.ErrNotExist) {
			return nil // deleted since the folder was read
		}
		if err != nil {
			return err
		}
		if n >= 0 && len(objects) == n {
			more = true
			return fs.SkipAll
		}
		objects = append(objects, ObjectInfo{Key: p, Size: info.Size(), ModTime: info.ModTime()})
		return nil
	})
	// A walk visits each folder in order, but "a/b" comes before "a-c" there and after it
	// as a string.
	slices.SortFunc(objects, func(a, b ObjectInfo) int { return strings.Compare(a.Key, b.Key) })
	return objects, more, err
}

// Partials lists the temporary files of puts under prefix: a put removes its own, whether it
// succeeds or fails, so one there was left by a put whose process died mid-write, or is a
// live put's. Started is the file's mtime, its last write.
func (f *File) Partials(ctx context.Context, prefix string) ([]Partial, error) {
	if err := checkPrefix(prefix); err != nil {
		return nil, fmt.Errorf("store: list partial writes %s: %w", prefix, err)
	}
	temps, _, err := f.walk(ctx, prefix, true, -1)
	if err != nil {
		return nil, fmt.Errorf("store: list partial writes %s: %w", prefix, err)
	}
	partials := make([]Partial, 0, len(temps))
	for _, t := range temps {
		partials = append(partials, Partial{Key: t.Key, Size: t.Size, Started: t.ModTime})
	}
	return partials, nil
}

// DiscardPartial removes a temporary file Partials listed.
func (f *File) DiscardPartial(ctx context.Context, p Partial) error {
	if !ValidKey(p.Key) || !strings.HasPrefix(path.Base(p.Key), tempPrefix) || checkKey(path.Dir(p.Key)) != nil && path.Dir(p.Key) != "." {
		return fmt.Errorf("store: discard %s: %w: not a temporary file of a put", p.Key, ErrInvalidKey)
	}
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("store: discard %s: %w", p.Key, err)
	}
	if err := f.root.Remove(p.Key); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("store: discard %s: %w", p.Key, err)
	}
	return nil
}

// PruneFolders removes the empty folders under prefix, deepest first, prefix's own included.
// A put that made its folder a moment before and has not created its file in it yet makes it
// again (put).
func (f *File) PruneFolders(ctx context.Context, prefix string) error {
	dir := strings.TrimSuffix(prefix, "/")
	if !ValidKey(dir) {
		return fmt.Errorf("store: prune %s: %w: give a folder", prefix, ErrInvalidKey)
	}
	var dirs []string
	err := fs.WalkDir(f.root.FS(), dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			if p == dir && errors.Is(notFound(err), ErrNotFound) {
				return fs.SkipAll
			}
			return err
		}
		if d.IsDir() {
			dirs = append(dirs, p)
		}
		return ctx.Err()
	})
	if err != nil {
		return fmt.Errorf("store: prune %s: %w", prefix, err)
	}
	for _, d := range slices.Backward(dirs) {
		// rmdir(2) removes only an empty folder; a folder with anything in it stays.
		if err := f.root.Remove(d); err != nil && !errors.Is(err, syscall.ENOTEMPTY) && !errors.Is(err, syscall.EEXIST) && !errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("store: prune %s: %w", prefix, err)
		}
	}
	return nil
}

// URL returns file://<dir>/<key>.
func (f *File) URL(key string) string { return "file://" + f.dir + "/" + key }

// checkKey returns an error wrapping ErrInvalidKey unless key is valid for this backend.
func checkKey(key string) error {
	if !ValidKey(key) {
		return fmt.Errorf("%w %q", ErrInvalidKey, key)
	}
	for part := range strings.SplitSeq(key, "/") {
		if strings.HasPrefix(part, tempPrefix) {
			return fmt.Errorf("%w %q: names starting with %s are reserved", ErrInvalidKey, key, tempPrefix)
		}
	}
	return nil
}

// checkPrefix accepts "" and any prefix that is a valid key, with or without a trailing slash.
func checkPrefix(prefix string) error {
	if prefix == "" || ValidKey(strings.TrimSuffix(prefix, "/")) {
		return nil
	}
	return fmt.Errorf("%w: prefix %q", ErrInvalidKey, prefix)
}

// notFound turns "no such file" and "a parent is a file" into ErrNotFound.
func notFound(err error) error {
	if errors.Is(err, fs.ErrNotExist) || errors.Is(err, syscall.ENOTDIR) {
		return ErrNotFound
	}
	return err
}

// notFolder explains the one layout a file system cannot hold and S3 can.
// mkdirAll makes the folders of an object; see File for the modes of a shared store.
func (f *File) mkdirAll(dir string) error {
	if !f.shared {
		return f.root.MkdirAll(dir, 0o750)
	}
	if dir == "." {
		return nil
	}
	parts := strings.Split(dir, "/")
	for i := range parts {
		name := path.Join(parts[:i+1]...)
		err := f.root.Mkdir(name, 0o770)
		switch {
		case errors.Is(err, fs.ErrExist):
		case err != nil:
			return err
		default:
			if err := f.root.Chmod(name, 0o770|os.ModeSetgid); err != nil {
				return err
			}
		}
	}
	return nil
}

func notFolder(err error) error {
	if errors.Is(err, syscall.ENOTDIR) || errors.Is(err, fs.ErrExist) {
		return fmt.Errorf("a parent of the key is an object, not a folder: %w", err)
	}
	return err
}

func randomHex() string {
	var b [12]byte
	_, _ = rand.Read(b[:]) // crypto/rand never fails on Linux
	return hex.EncodeToString(b[:])
}

// ctxReader stops a copy once its context is done.
type ctxReader struct {
	ctx context.Context
	r   io.Reader
}

func (c ctxReader) Read(p []byte) (int, error) {
	if err := c.ctx.Err(); err != nil {
		return 0, err
	}
	return c.r.Read(p)
}
