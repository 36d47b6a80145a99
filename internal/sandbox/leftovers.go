package sandbox

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// A worker that crashes leaves its sandboxes' host state behind: their folders under Root and
// their cgroups (bwrap dies with the worker, and the sandboxed processes with it). Each sandbox
// therefore holds an exclusive flock on Root/<id>.lock for as long as it exists. The kernel
// drops the lock when the holder dies, however it dies, and a reused pid cannot fake it, so a
// lock file that can be locked belongs to a sandbox no live worker owns. The file names the
// sandbox's cgroups. NewBubblewrap removes what such lock files describe, the lock file last;
// nothing without a lock file of Boxcar's naming is touched, and neither are lock files that
// a live worker holds (workers may share a Root).

// sandboxIDPattern matches every id Start makes: "boxcar-" + safeID of the job + "-" + 8 hex
// digits, or, for a warm pool's sandbox, "boxcar-pool-" + safeID of the profile + "-" + 8 hex
// digits. The pool's prefix is not part of safeID's 40 characters: without it here, a pool
// sandbox of a profile named with 36 characters or more was left on the host by every crash.
var sandboxIDPattern = regexp.MustCompile(`^boxcar-(pool-)?[A-Za-z0-9_.-]{1,40}-[0-9a-f]{8}$`)

const (
	lockSuffix      = ".lock"
	lockCgroupLine  = "cgroup "
	maxLockFileSize = 64 << 10
	leftoverGrace   = 10 * time.Second // bound on killing and removing one leftover's cgroups
)

// sandboxLock is a sandbox's claim on its host state.
type sandboxLock struct {
	path string
	f    *os.File
}

// lockSandbox creates Root/<id>.lock and locks it.
func lockSandbox(root, id string) (*sandboxLock, error) {
	path := filepath.Join(root, id+lockSuffix)
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return nil, fmt.Errorf("sandbox: start: lock file: %w", err)
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		// Another worker's leftover sweep took it between the create and the lock; it will
		// remove the file.
		f.Close()
		return nil, fmt.Errorf("sandbox: start: lock %s: %w", path, err)
	}
	l := &sandboxLock{path: path, f: f}
	if !l.stillAtPath() {
		f.Close()
		return nil, fmt.Errorf("sandbox: start: lock %s was removed while being taken; start again", path)
	}
	return l, nil
}

// stillAtPath says whether the locked file is the one the path names: a sweep may have removed
// it, and another file been made under the name, before the lock was taken.
func (l *sandboxLock) stillAtPath() bool {
	var held, named unix.Stat_t
	if unix.Fstat(int(l.f.Fd()), &held) != nil || unix.Lstat(l.path, &named) != nil {
		return false
	}
	return held.Dev == named.Dev && held.Ino == named.Ino
}

// record writes the cgroup folders into the lock file, for whoever cleans up after a crash.
func (l *sandboxLock) record(cgroupDirs []string) error {
	var b strings.Builder
	for _, d := range cgroupDirs {
		b.WriteString(lockCgroupLine + d + "\n")
	}
	if err := l.f.Truncate(0); err != nil {
		return fmt.Errorf("sandbox: start: record cgroups in %s: %w", l.path, err)
	}
	if _, err := l.f.WriteAt([]byte(b.String()), 0); err != nil {
		return fmt.Errorf("sandbox: start: record cgroups in %s: %w", l.path, err)
	}
	return nil
}

// release removes the lock file, then drops the lock: the sandbox is gone.
func (l *sandboxLock) release() error {
	err := os.Remove(l.path)
	if errors.Is(err, os.ErrNotExist) {
		err = nil
	}
	l.f.Close()
	if err != nil {
		return fmt.Errorf("remove lock file: %w", err)
	}
	return nil
}

// removeLeftovers removes the host state of sandboxes whose worker is gone and returns how
// many it removed. What it cannot remove it leaves, and reports.
func (p *BubblewrapProvider) removeLeftovers() (int, error) {
	entries, err := os.ReadDir(p.root)
	if err != nil {
		return 0, fmt.Errorf("sandbox: bubblewrap: look for leftovers in %s: %w", p.root, err)
	}
	var n int
	var errs []error
	for _, e := range entries {
		id, ok := strings.CutSuffix(e.Name(), lockSuffix)
		if !ok || !sandboxIDPattern.MatchString(id) || !e.Type().IsRegular() {
			continue
		}
		removed, err := p.removeLeftover(id)
		if err != nil {
			errs = append(errs, err)
		}
		if removed {
			n++
		}
	}
	return n, errors.Join(errs...)
}

// removeLeftover removes one sandbox's state if no live worker holds its lock.
func (p *BubblewrapProvider) removeLeftover(id string) (bool, error) {
	l, data, err := p.lockLeftover(id)
	if l == nil || err != nil {
		return false, err
	}
	if err := p.removeLeftoverState(id, data); err != nil {
		l.f.Close() // keep the lock file: the next start tries again
		return false, fmt.Errorf("sandbox: leftover %s: %w", id, err)
	}
	if err := l.release(); err != nil {
		return false, fmt.Errorf("sandbox: leftover %s: %w", id, err)
	}
	p.log.Warn("removed a sandbox left by a worker that stopped", "sandbox_id", id)
	return true, nil
}

// lockLeftover takes the lock of sandbox id and reads its lock file; a nil lock and no error
// when a live worker holds it or it is gone.
func (p *BubblewrapProvider) lockLeftover(id string) (*sandboxLock, []byte, error) {
	path := filepath.Join(p.root, id+lockSuffix)
	f, err := os.OpenFile(path, os.O_RDWR|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil, nil, nil // its owner just finished
		}
		return nil, nil, fmt.Errorf("sandbox: leftover %s: %w", id, err)
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		f.Close()
		if errors.Is(err, unix.EWOULDBLOCK) {
			return nil, nil, nil // a live worker's sandbox
		}
		return nil, nil, fmt.Errorf("sandbox: leftover %s: lock: %w", id, err)
	}
	l := &sandboxLock{path: path, f: f}
	if !l.stillAtPath() {
		f.Close()
		return nil, nil, nil // its owner released it meanwhile
	}
	data, err := io.ReadAll(io.LimitReader(f, maxLockFileSize))
	if err != nil {
		f.Close()
		return nil, nil, fmt.Errorf("sandbox: leftover %s: read %s: %w", id, path, err)
	}
	return l, data, nil
}

// removeLeftoverState removes what sandbox id left: its cgroups (named in lockFile), its
// workdir, its scratch folder and its egress folder, each tried whatever the others did.
func (p *BubblewrapProvider) removeLeftoverState(id string, lockFile []byte) error {
	var errs []error
	cg := &cgroup{dirs: p.leftoverCgroups(id, lockFile)}
	stop := make(chan struct{})
	t := time.AfterFunc(leftoverGrace, func() { close(stop) })
	if err := cg.remove(stop); err != nil {
		errs = append(errs, err)
	}
	t.Stop()
	dir := filepath.Join(p.root, id)
	for _, d := range []string{dir, dir + scratchSuffix} {
		if fi, err := os.Lstat(d); err == nil && fi.IsDir() {
			if err := removeMount(d); err != nil {
				errs = append(errs, err)
			}
		}
	}
	if err := os.RemoveAll(dir + egressSuffix); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// leftoverCgroups are the cgroup folders of a leftover sandbox that still exist: those its lock
// file names, and its name under this worker's cgroup parents (for a crash between making
// them and recording them). A named folder is taken only if it is called id and lies on a cgroup
// filesystem, so a damaged lock file cannot send the sweep anywhere else.
func (p *BubblewrapProvider) leftoverCgroups(id string, lockFile []byte) []string {
	var candidates []string
	sc := bufio.NewScanner(bytes.NewReader(lockFile))
	for sc.Scan() {
		if dir, ok := strings.CutPrefix(sc.Text(), lockCgroupLine); ok {
			candidates = append(candidates, dir)
		}
	}
	for _, c := range p.cgroups.controllers() {
		candidates = append(candidates, filepath.Join(p.cgroups.parent[c], id))
	}
	var dirs []string
	for _, dir := range candidates {
		if !filepath.IsAbs(dir) || filepath.Clean(dir) != dir || filepath.Base(dir) != id || slices.Contains(dirs, dir) {
			continue
		}
		var st unix.Statfs_t
		if unix.Statfs(dir, &st) != nil || (st.Type != unix.CGROUP_SUPER_MAGIC && st.Type != unix.CGROUP2_SUPER_MAGIC) {
			continue
		}
		if fi, err := os.Lstat(dir); err != nil || !fi.IsDir() {
			continue
		}
		dirs = append(dirs, dir)
	}
	return dirs
}
