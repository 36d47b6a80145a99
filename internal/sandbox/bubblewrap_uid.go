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

// uidsDir is the folder under Root where each live sandbox's host uid is claimed, for every
// worker that shares the Root: Root/.uids/<uid>, locked (flock) by the worker whose sandbox
// runs as it. The kernel drops the lock when that worker dies, however it dies, so the uid of
// a crashed worker's sandbox is free again once its leftovers are gone (the sweep at the next
// start, before any sandbox of that worker starts). Workers that share a host uid range must
// share the Root, or the lock: docs/sandbox.md.
const uidsDir = ".uids"

// uidClaim is a sandbox's hold on its host uid.
type uidClaim struct{ l *sandboxLock }

// allocUID picks a host uid for a sandbox that no live sandbox of any worker on this Root
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
	return 0, fmt.Errorf("sandbox: start: all %d host uids from %d are taken (%d by other workers on %s); widen the range (FirstUID, UIDs)",
		p.uids, p.firstUID, len(busy), p.root)
}

// claimUID locks Root/.uids/<uid>; nil and no error when another worker's sandbox holds it.
func (p *BubblewrapProvider) claimUID(uid int) (*uidClaim, error) {
	dir := filepath.Join(p.root, uidsDir)
	if err := os.Mkdir(dir, 0o700); err != nil && !errors.Is(err, os.ErrExist) {
		return nil, fmt.Errorf("sandbox: start: make %s: %w", dir, err)
	}
	path := filepath.Join(dir, strconv.Itoa(uid))
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
// sandboxes of a worker that died, whose other leftovers removeLeftovers has removed. Each is
// removed under its lock, as freeUID does, so that a worker claiming the uid meanwhile tries
// another.
func (p *BubblewrapProvider) removeStaleUIDClaims() error {
	entries, err := os.ReadDir(filepath.Join(p.root, uidsDir))
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
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
