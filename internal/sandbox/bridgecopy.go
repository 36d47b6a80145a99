package sandbox

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"

	"golang.org/x/sys/unix"
)

// Each version of the worker puts its binary, the egress bridge, into Root under its digest
// (placeBridge), and an upgrade brings another. A sandbox with egress holds a shared flock on
// the copy it binds for as long as it exists (holdBridge); NewBubblewrap removes every copy that
// no live sandbox of any worker on Root holds (removeStaleBridges), as it removes leftover
// sandboxes: a worker of an older version still running its sandboxes keeps its copy, and one
// that starts a sandbox after the sweep puts its copy back.

const bridgePrefix = "egress-bridge-"

// bridgeCopyPattern matches a copy placeBridge made; not one it is making (under a temporary
// name), which another worker may be about to rename into place.
var bridgeCopyPattern = regexp.MustCompile(`^` + bridgePrefix + `[0-9a-f]{16}$`)

// holdBridge returns the copy of bin at dst, placed there if it is not, opened and locked shared:
// the sweep of another worker starting on Root leaves it while the file stays open.
func holdBridge(bin, dst string) (*os.File, error) {
	for range 3 {
		if err := placeBridge(bin, dst); err != nil {
			return nil, err
		}
		f, err := os.Open(dst)
		if errors.Is(err, os.ErrNotExist) {
			continue // swept between the two
		}
		if err != nil {
			return nil, fmt.Errorf("sandbox: egress bridge: %w", err)
		}
		// Waits for a sweep that holds it while it removes it.
		if err := unix.Flock(int(f.Fd()), unix.LOCK_SH); err != nil {
			f.Close()
			return nil, fmt.Errorf("sandbox: egress bridge: lock %s: %w", dst, err)
		}
		if (&sandboxLock{path: dst, f: f}).stillAtPath() {
			return f, nil
		}
		f.Close() // swept while this waited for the lock
	}
	return nil, fmt.Errorf("sandbox: egress bridge: %s was removed again and again while being placed; attach again", dst)
}

// removeStaleBridges removes the copies of the bridge no sandbox holds and returns how many.
func (p *BubblewrapProvider) removeStaleBridges() (int, error) {
	entries, err := os.ReadDir(p.root)
	if err != nil {
		return 0, fmt.Errorf("sandbox: bubblewrap: look for old egress bridges in %s: %w", p.root, err)
	}
	var n int
	var errs []error
	for _, e := range entries {
		if !strings.HasPrefix(e.Name(), bridgePrefix) || !bridgeCopyPattern.MatchString(e.Name()) || !e.Type().IsRegular() {
			continue
		}
		removed, err := removeUnheld(filepath.Join(p.root, e.Name()))
		if err != nil {
			errs = append(errs, err)
		}
		if removed {
			n++
		}
	}
	return n, errors.Join(errs...)
}

// removeUnheld removes the file at path unless someone holds a lock on it.
func removeUnheld(path string) (bool, error) {
	f, err := os.OpenFile(path, os.O_RDONLY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if errors.Is(err, os.ErrNotExist) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("sandbox: old egress bridge: %w", err)
	}
	defer f.Close()
	if unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB) != nil {
		return false, nil // a live sandbox binds it
	}
	if !(&sandboxLock{path: path, f: f}).stillAtPath() {
		return false, nil
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return false, fmt.Errorf("sandbox: remove old egress bridge: %w", err)
	}
	return true, nil
}
