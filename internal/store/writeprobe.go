package store

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"strings"
	"sync"
	"syscall"
	"time"
)

// WriteProbeKey is the object a worker writes, create-only, in a tenant's folder before it runs
// a job of the tenant (the Probe of a ForTenant store): under runs/, where the job's run is
// written, so that credentials scoped to the runs of a tenant pass it. The tenant's List does
// not show it, and `submit gc` leaves it (it is in no attempt folder).
const WriteProbeKey = "runs/.boxcar-write-probe.txt"

var writeProbeBody = []byte("Boxcar's workers write this object create-only to prove that they may write the runs of\n" +
	"this tenant before they run its jobs. Leave it; it is never read.\n")

// ErrWriteRefused marks a tenant's folder the store refuses the worker's writes to for want of
// permission: S3's AccessDenied (an IAM or bucket policy scoped by prefix that leaves the tenant
// out), the file store's EACCES, EPERM or EROFS. No job of the tenant could be committed there
// until the operator changes that, so none is run. Other faults of the proof (a 5xx, a network
// error, an expired token, a skewed clock) are not this: they may pass.
var ErrWriteRefused = errors.New("the store refuses the worker's writes")

// writeRefusalHold is the part of a store's probe interval a refusal is held for: a minute's
// tenth, so that a fixed policy is taken within seconds while a queue of the tenant's jobs
// costs one refused write every few seconds, not one each.
const writeRefusalHold = 10

// writeProver is a backend that holds its proofs of writes under a folder, per folder, for
// every ForTenant store made on it: an attempt's tenant store lives for one job.
type writeProver interface {
	writeProofs() (*writeProofs, time.Duration)
	// remedy says what to change so that the worker may write under folder.
	remedy(folder string) string
	// keyRemedy says what to change so that the worker may write key itself.
	keyRemedy(key string) string
	// keyRefuser names what refuses a key (keyRefused, readKeyRefused) under the tenant's
	// folder alone, or in every tenant's folder too (every): S3's policy, a file's mode.
	keyRefuser(every bool) string
}

// keyRefuser is st's keyRefuser, a policy's words for a store that holds no proofs.
func keyRefuser(st Store, every bool) string {
	if wp, ok := st.(writeProver); ok {
		return wp.keyRefuser(every)
	}
	return policyRefuser(every)
}

// policyRefuser names a policy on the key (S3's).
func policyRefuser(every bool) string {
	if every {
		return "a policy on this key's name in every tenant's folder"
	}
	return "a policy on this key under the tenant's folder alone"
}

// keyProbeFolder is where keyRefused writes a refused key again: a folder of the tenants'
// that is no tenant's (no tenant name starts with a dot), so a policy on a key's name in every
// tenant's folder (tenants/*/runs/*/manifest.json) refuses it there too, and one on this
// tenant's or this run's folder does not.
const keyProbeFolder = "tenants/.boxcar-probe/"

// keyProbe is the key under folder (a tenant's) written again in keyProbeFolder, no longer than
// key: S3 takes keys of 1,024 bytes at most, and a probe longer than a key near that would be
// refused as too long, telling nothing. The folder is longer than a tenant's of fewer than 13
// letters, so the run's id (runs/<id>/…: a time and a random part, which a policy on the key's
// name in every tenant's folder names with a *) is cut short by as much, its random part's end.
// An input's key (inputs/sha256/<hex>) is never near the limit, and stays whole.
func keyProbe(folder, key string) string {
	rest := strings.TrimPrefix(key, folder)
	probe := keyProbeFolder + rest
	over := len(probe) - len(key)
	id, tail, ok := strings.Cut(strings.TrimPrefix(rest, "runs/"), "/")
	if over <= 0 || !ok || !strings.HasPrefix(rest, "runs/") || len(id) <= over {
		return probe
	}
	return keyProbeFolder + "runs/" + id[:len(id)-over] + "/" + tail
}

// keyRefused tells whose the refusal of a write of key under folder (err, a refusedWrite) is.
// The folder is proven again: refused, it is the tenant's folder's, and err stands. Taken,
// the refusal is of the key alone, and the same key under keyProbeFolder tells by whom: taken
// there too, a policy on this tenant's path (its run's folder, one key of it) refuses it, the
// tenant's (err, saying so); refused there too, a policy on the key's name refuses it in every
// tenant's folder, the worker's (ErrWorkerRefused, as the store's own object refused). The
// probe's object is removed. A proof that cannot tell (an outage) is the error: no refusal is
// claimed.
func keyRefused(ctx context.Context, st Store, folder, key string, err error) error {
	wp, ok := st.(writeProver)
	if !ok || !refusedWrite(err) {
		return err
	}
	proofs, _ := wp.writeProofs()
	proofs.forget(folder)
	switch perr := proveWrites(ctx, st, folder); {
	case errors.Is(perr, ErrWriteRefused), errors.Is(perr, ErrWorkerRefused):
		return err
	case perr != nil:
		return fmt.Errorf("%v; proving the folder %s again to tell whose refusal it is: %w", err, st.URL(folder), perr)
	}
	probe := keyProbe(folder, key)
	perr := st.PutIfAbsent(ctx, probe, bytes.NewReader(nil), 0)
	switch {
	case perr == nil || errors.Is(perr, ErrExists):
		dropKeyProbe(ctx, st, probe)
		return fmt.Errorf("%w (%s refuses it: the folder's proof %s and the same key in no tenant's folder, %s, took. %s)",
			err, wp.keyRefuser(false), st.URL(folder+WriteProbeKey), st.URL(probe), wp.keyRemedy(key))
	case refusedWrite(perr):
		return &refusal{err: err, by: byStore, why: fmt.Sprintf("%s refuses it: the same key in no tenant's folder, %s, is refused too, while the tenant's folder takes its proof %s; no job may commit while it lasts. %s",
			wp.keyRefuser(true), st.URL(probe), st.URL(folder+WriteProbeKey), wp.keyRemedy(key))}
	}
	return fmt.Errorf("%v; writing the key again in no tenant's folder (%s) to tell whose refusal it is: %w", err, st.URL(probe), perr)
}

// readKeyRefused tells whose the refusal of a read of key under folder is (err,
// ErrReadRefused: the store's own object reads), as keyRefused does a write's: the same key is
// written in no tenant's folder (keyProbeFolder) and read back, without proving the store a
// second time (readAgain): one proof of the store a refused read. Refused there too, a policy on
// the key's name in every tenant's folder (tenants/*/inputs/*) refuses it, the worker's
// (ErrWorkerRefused, and no longer ErrReadRefused, which fails the tenant's job); read there,
// a policy on this tenant's path refuses it, err. A probe that cannot tell (an outage, its
// write refused) claims no refusal: its error is waited out. The probe's object is removed.
func readKeyRefused(ctx context.Context, st Store, folder, key string, err error) error {
	if !errors.Is(err, ErrReadRefused) {
		return err
	}
	probe := keyProbe(folder, key)
	if perr := st.PutIfAbsent(ctx, probe, bytes.NewReader(nil), 0); perr != nil && !errors.Is(perr, ErrExists) {
		return fmt.Errorf("%v; writing the key in no tenant's folder (%s) to tell whose refusal it is: %v", err, st.URL(probe), perr)
	}
	defer dropKeyProbe(ctx, st, probe)
	perr := readAgain(ctx, st, probe)
	switch {
	case perr == nil:
		return fmt.Errorf("%w (the same key in no tenant's folder, %s, reads)", err, st.URL(probe))
	case errors.Is(perr, ErrReadRefused):
		return &refusal{err: errors.New(err.Error()), by: byStore, why: fmt.Sprintf("%s refuses reading it: the same key in no tenant's folder, %s, is refused too; no job with it may run while it lasts", keyRefuser(st, true), st.URL(probe))}
	}
	return fmt.Errorf("%v; reading the key in no tenant's folder (%s) to tell whose refusal it is: %v", err, st.URL(probe), perr)
}

// readAgain reads key of st and closes it. A store that sorts its refused reads (the S3
// store's readRefusedWhere) proved itself for the read that readKeyRefused sorts, so the key's
// probe is read without a second proof (readAgain of the store).
func readAgain(ctx context.Context, st Store, key string) error {
	if r, ok := st.(interface {
		readAgain(context.Context, string) error
	}); ok {
		return r.readAgain(ctx, key)
	}
	rc, err := st.Get(ctx, key)
	if err == nil {
		rc.Close()
	}
	return err
}

// dropKeyProbe removes the object keyRefused or readKeyRefused wrote, and the file store's
// folders it made: no tenant's `submit gc` prunes keyProbeFolder.
func dropKeyProbe(ctx context.Context, st Store, probe string) {
	if st.Delete(ctx, probe) == nil {
		_ = PruneFolders(ctx, st, keyProbeFolder)
	}
}

// proveWrites proves that st takes writes under folder (a tenant's, with a trailing slash) by
// writing WriteProbeKey there create-only: a refusal for want of permission comes before the
// server looks whether the object exists, so finding it there is a proof too. A store that
// holds no proofs (one wrapping another) is not proven, as Probe does not prove it.
func proveWrites(ctx context.Context, st Store, folder string) error {
	wp, ok := st.(writeProver)
	if !ok {
		return nil
	}
	proofs, interval := wp.writeProofs()
	return proofs.prove(ctx, folder, interval, func(ctx context.Context) error {
		err := st.PutIfAbsent(ctx, folder+WriteProbeKey, bytes.NewReader(writeProbeBody), int64(len(writeProbeBody)))
		switch {
		case err == nil, errors.Is(err, ErrExists):
			return nil
		case refusedWrite(err):
			return fmt.Errorf("store: %w under %s: %w; %s", ErrWriteRefused, st.URL(folder), err, wp.remedy(folder))
		}
		return err
	})
}

// refusedWrite tells a refusal of the tenant's folder for want of permission (a row of
// s3Answers of byFolder: AccessDenied; the file store's EACCES, EPERM or EROFS) from other
// faults of a write. A refusal of the store as a whole or of the worker (refusal: the bucket
// gone, the store's own probe object refused, a wrong key) is not the folder's, and neither is
// an AccessDenied on the way to the worker's credentials (STS refusing its role:
// ErrCredentials): each refuses every tenant's writes while it lasts, and is waited for as an
// outage of the store is.
func refusedWrite(err error) bool {
	var ref *refusal
	if errors.Is(err, ErrCredentials) || errors.As(err, &ref) {
		return false
	}
	if a, ok := answerTo(err); ok {
		return a.by == byFolder
	}
	return errors.Is(err, fs.ErrPermission) || errors.Is(err, syscall.EROFS)
}

// errProofUnfinished is the result of a proof whose put never returned (it panicked).
var errProofUnfinished = errors.New("store: the proof of writes did not finish")

// writeProofs holds the latest proof of writes under each folder of one store. One proof is
// in flight per folder at a time: the callers that come while it runs wait for it and take
// its result, so a queue of a tenant's jobs costs one write, not one each.
type writeProofs struct {
	mu sync.Mutex
	by map[string]*writeProof
}

// writeProof is one proof: done is closed when err and until are set.
type writeProof struct {
	done  chan struct{}
	err   error
	until time.Time // when the result stops holding; zero: it held for its waiters only
}

// prove returns the proof of folder held, else the one in flight, else put's result, which
// holds for interval when put proved the writes, a tenth of it when it found them refused,
// and for nobody after when it proved nothing (an outage, a cancelled context).
func (w *writeProofs) prove(ctx context.Context, folder string, interval time.Duration, put func(context.Context) error) error {
	for {
		w.mu.Lock()
		p := w.by[folder]
		if p == nil || p.settled() && !time.Now().Before(p.until) {
			p = &writeProof{done: make(chan struct{})}
			if w.by == nil {
				w.by = map[string]*writeProof{}
			}
			w.by[folder] = p
			w.mu.Unlock()
			p.run(ctx, interval, put)
			return p.err
		}
		w.mu.Unlock()
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-p.done:
		}
		// The proof of a caller whose context ended says nothing of this caller's.
		if p.err == nil || ctx.Err() != nil || !errors.Is(p.err, context.Canceled) && !errors.Is(p.err, context.DeadlineExceeded) {
			return p.err
		}
	}
}

// forget drops the settled proof of folder, so that the next prove proves it again.
func (w *writeProofs) forget(folder string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if p := w.by[folder]; p != nil && p.settled() {
		delete(w.by, folder)
	}
}

func (p *writeProof) settled() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

func (p *writeProof) run(ctx context.Context, interval time.Duration, put func(context.Context) error) {
	defer close(p.done)
	p.err = errProofUnfinished // as the waiters see it if put panics
	p.err = put(ctx)
	switch {
	case p.err == nil:
		p.until = time.Now().Add(interval)
	case errors.Is(p.err, ErrWriteRefused):
		p.until = time.Now().Add(interval / writeRefusalHold)
	}
}
