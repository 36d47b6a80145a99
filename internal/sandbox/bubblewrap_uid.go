package sandbox

import (
	"crypto/rand"
	"errors"
	"fmt"
	"math/big"
	"os"
	"path/filepath"
	"strconv"

	"golang.org/x/sys/unix"
)

// Each live sandbox's host uid is claimed in the host's folder of claims (UIDClaims), for
// every worker on the host whatever its Root: UIDClaims/<uid>, locked (flock) by the worker
// whose sandbox runs as it. Under the Root, as they were, workers on two Roots each gave out
// the same uids. The kernel drops the lock when that worker dies, however it dies, so the uid
// of a crashed worker's sandbox is free at once (its bwrap dies with it); the file is removed
// by the next worker that starts on the host. docs/sandbox.md.

// prepareUIDClaims makes the folder of claims, mode 0700, and refuses one that is not root's
// own folder: whoever else could write it could hold every uid, or free a live sandbox's.
func prepareUIDClaims(dir string) (string, error) {
	dir, err := filepath.Abs(dir)
	if err != nil {
		return "", fmt.Errorf("sandbox: bubblewrap: uid claims %s: %w", dir, err)
	}
	if err := os.MkdirAll(filepath.Dir(dir), 0o755); err != nil {
		return "", fmt.Errorf("sandbox: bubblewrap: make the folder of uid claims %s: %w", dir, err)
	}
	if err := os.Mkdir(dir, 0o700); err != nil && !errors.Is(err, os.ErrExist) {
		return "", fmt.Errorf("sandbox: bubblewrap: make the folder of uid claims %s: %w", dir, err)
	}
	var st unix.Stat_t
	if err := unix.Lstat(dir, &st); err != nil {
		return "", fmt.Errorf("sandbox: bubblewrap: uid claims %s: %w", dir, err)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFDIR || st.Uid != 0 {
		return "", fmt.Errorf("sandbox: bubblewrap: uid claims %s is not a folder of root's own (a link, or another owner); remove it, or name another (UIDClaims)", dir)
	}
	if err := os.Chmod(dir, 0o700); err != nil {
		return "", fmt.Errorf("sandbox: bubblewrap: uid claims %s: %w", dir, err)
	}
	return dir, nil
}

// uidClaim is a sandbox's hold on its host uid.
type uidClaim struct{ l *sandboxLock }

// allocUID picks a host uid for a sandbox that no live sandbox of any worker on this host
// has: at random, so that workers seldom try the same one, then claimed (claimUID).
func (p *BubblewrapProvider) allocUID() (int, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	busy := map[int]bool{} // other workers' uids, found while picking
	for len(p.inUse)+len(busy) < p.uids {
		n, err := rand.Int(rand.Reader, big.NewInt(int64(p.uids)))
		if err != nil {
			return 0, fmt.Errorf("sandbox: start: pick a host uid: %w", err)
		}
		uid := p.firstUID + int(n.Int64())
		if p.inUse[uid] != nil || busy[uid] {
			continue
		}
		c, err := p.claimUID(uid)
		if err != nil {
			return 0, err
		}
		if c == nil {
			busy[uid] = true
			continue
		}
		p.inUse[uid] = c
		return uid, nil
	}
	return 0, fmt.Errorf("sandbox: start: all %d host uids from %d are taken (%d by other workers on this host, %s); widen the range (FirstUID, UIDs)",
		p.uids, p.firstUID, len(busy), p.uidClaims)
}

// claimUID locks UIDClaims/<uid>; nil and no error when another worker's sandbox holds it.
func (p *BubblewrapProvider) claimUID(uid int) (*uidClaim, error) {
	path := filepath.Join(p.uidClaims, strconv.Itoa(uid))
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return nil, fmt.Errorf("sandbox: start: claim host uid %d: %w", uid, err)
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		f.Close()
		if errors.Is(err, unix.EWOULDBLOCK) {
			return nil, nil
		}
		return nil, fmt.Errorf("sandbox: start: claim host uid %d: %w", uid, err)
	}
	l := &sandboxLock{path: path, f: f}
	if !l.stillAtPath() {
		// Its holder released it (removed the file) between the open and the lock: another
		// file may be claimed under the name now. Taken for busy; another uid is picked.
		f.Close()
		return nil, nil
	}
	return &uidClaim{l: l}, nil
}

// freeUID gives a sandbox's uid back: the claim's file removed before its lock is dropped, so
// that a worker that opened it meanwhile finds it gone (stillAtPath).
func (p *BubblewrapProvider) freeUID(uid int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if c := p.inUse[uid]; c != nil {
		if err := c.l.release(); err != nil {
			p.log.Warn("sandbox: the claim of a host uid is left behind; the uid is free all the same", "uid", uid, "error", err)
		}
	}
	delete(p.inUse, uid)
}

// removeStaleUIDClaims removes the claims of host uids that no live worker holds: those of the
// sandboxes of a worker on this host that died, on any Root. Each is removed under its lock, as freeUID does, so that a worker claiming the uid meanwhile tries
// another.
func (p *BubblewrapProvider) removeStaleUIDClaims() error {
	if !p.asRoot {
		return nil
	}
	entries, err := os.ReadDir(p.uidClaims)
	if err != nil {
		return fmt.Errorf("sandbox: bubblewrap: look for stale uid claims: %w", err)
	}
	var errs []error
	for _, e := range entries {
		uid, err := strconv.Atoi(e.Name())
		if err != nil || !e.Type().IsRegular() {
			continue
		}
		c, err := p.claimUID(uid)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if c != nil {
			errs = append(errs, c.l.release())
		}
	}
	return errors.Join(errs...)
}
