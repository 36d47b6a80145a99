package queue

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/boxcar-run/boxcar/internal/job"
)

// getStatus returns what the status bucket holds under key; ErrUnknownJob when nothing.
func getStatus(ctx context.Context, kv getter, r Ref) (job.Status, error) {
	if !job.ValidID(r.ID) {
		return job.Status{}, fmt.Errorf("%w: %q is not a job id", ErrUnknownJob, r.ID)
	}
	st, rev, err := read[job.Status](ctx, kv, r.key())
	if err != nil {
		return job.Status{}, fmt.Errorf("queue: status of %s: %w", r, err)
	}
	if rev == 0 {
		return job.Status{}, fmt.Errorf("%w: %s", ErrUnknownJob, r.ID)
	}
	st.ID = r.ID
	return st, nil
}

// Status returns what the job's tenant's status bucket holds for it, else the shared one
// (statusbuckets.go); ErrUnknownJob when neither holds anything.
func (c *Consumer) Status(ctx context.Context, r Ref) (job.Status, error) {
	kv, err := c.statuses.reader(ctx, r.Tenant)
	if err != nil {
		return job.Status{}, err
	}
	return getStatus(ctx, kv, r)
}

// UpdateStatus applies change to a job's status with compare-and-set, retrying on a concurrent
// writer, and returns the status written. A terminal status is never changed again, so a stale
// attempt cannot overwrite a final outcome; each of conds may refuse the write too (ByAttempt,
// OnlyNew). A refused write changes nothing and returns the status found with the refusal.
//
// The first try starts from the status this handle wrote last for the job, when it has one: a
// worker writes a running job's status a dozen times (progress, spending, outcome), and so each
// write is one round trip, not a read and a write. If anyone else wrote in between, the
// compare-and-set fails and the next try reads the current value.
func (c *Consumer) UpdateStatus(ctx context.Context, r Ref, change func(*job.Status), conds ...StatusCond) (job.Status, error) {
	return c.updateStatus(ctx, r, c.written.get(r.key()), change, conds)
}

// UpdateNewStatus is UpdateStatus for a job most likely without a status yet, a first
// delivery's (submit writes none): unless this handle wrote one, its first try creates the key
// instead of reading it, which saves a round trip on the claim of nearly every job. A status
// that exists (a cancel asked while the job waited, a stream restored) costs one refused
// create; then the key is read.
func (c *Consumer) UpdateNewStatus(ctx context.Context, r Ref, change func(*job.Status), conds ...StatusCond) (job.Status, error) {
	first := c.written.get(r.key())
	if !first.ok {
		first = guess[job.Status]{ok: true} // none: the zero status at revision 0
	}
	return c.updateStatus(ctx, r, first, change, conds)
}

// StatusCond is a condition a status write holds the stored status to (its revision 0 when
// there is none): an error refuses the write. It is checked in the compare-and-set, so no
// writer can slip in between the check and the write.
type StatusCond func(st job.Status, rev uint64) error

// ByAttempt refuses, with ErrSuperseded, to change a status that a later delivery of the job
// than attempt wrote: a delivery that outlived its ack wait (a pause with no heartbeat) must
// not overwrite the status of the delivery the server made after it.
func ByAttempt(attempt int) StatusCond {
	return func(st job.Status, _ uint64) error {
		if st.Attempt > attempt {
			return fmt.Errorf("%w: attempt %d holds the job %s, this write is attempt %d's", ErrSuperseded, st.Attempt, st.ID, attempt)
		}
		return nil
	}
}

// OnlyNew refuses, with ErrStatusExists, to change a status that exists: the write may create
// a status, never take one over.
func OnlyNew(st job.Status, rev uint64) error {
	if rev != 0 {
		return fmt.Errorf("%w: %s", ErrStatusExists, st.ID)
	}
	return nil
}

func (c *Consumer) updateStatus(ctx context.Context, r Ref, first guess[job.Status], change func(*job.Status), conds []StatusCond) (job.Status, error) {
	key := r.key()
	kv, err := c.statuses.of(ctx, r.Tenant)
	if err != nil {
		return job.Status{}, fmt.Errorf("queue: update status of %s: %w", r, err)
	}
	// A job this handle has not written may have a status an older worker wrote in the shared
	// bucket during an upgrade: it is moved first, so that the write starts from it.
	if !c.written.get(key).ok {
		if err := c.statuses.adopt(ctx, kv, r.key()); err != nil {
			return job.Status{}, fmt.Errorf("queue: update status of %s: %w", r, err)
		}
	}
	st, rev, err := update(ctx, kv, key, first, func(st *job.Status, rev uint64) (bool, error) {
		if st.State.Terminal() {
			return false, fmt.Errorf("%w: job %s is already %s", ErrFinal, r.ID, st.State)
		}
		st.ID = r.ID // for the conditions' errors: the body may name nothing
		for _, cond := range conds {
			if err := cond(*st, rev); err != nil {
				return false, err
			}
		}
		change(st)
		if st.State.Terminal() {
			st.Ending = "" // the end claimed is the end recorded now
		}
		st.ID = r.ID
		st.UpdatedAt = time.Now().UTC()
		return true, nil
	})
	if err != nil {
		c.written.drop(key)
		if statusRefused(err) {
			return st, err
		}
		return job.Status{}, fmt.Errorf("queue: update status of %s: %w", r, err)
	}
	c.written.put(key, st, rev)
	return st, nil
}

// statusRefused: a status write that found the status ended, or failing one of its conditions.
func statusRefused(err error) bool {
	return errors.Is(err, ErrFinal) || errors.Is(err, ErrSuperseded) || errors.Is(err, ErrStatusExists)
}

// statusCache holds the status a handle wrote last for each job, with its revision, until
// the job ends. It only ever saves a read: a stale entry makes the compare-and-set fail.
type statusCache struct {
	mu sync.Mutex
	m  map[string]guess[job.Status]
}

// maxWritten bounds the cache: jobs handed back unfinished (a worker stopping) leave entries.
const maxWritten = 4096

// get and put copy the status (job.Status.Clone): writes of one job under way at once each
// change their own, and a caller's edit of the status a write returned changes no guess.
func (c *statusCache) get(key string) guess[job.Status] {
	c.mu.Lock()
	defer c.mu.Unlock()
	g := c.m[key]
	g.v = g.v.Clone()
	return g
}

func (c *statusCache) put(key string, st job.Status, rev uint64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if st.State.Terminal() {
		delete(c.m, key) // never written again
		return
	}
	if c.m == nil || len(c.m) >= maxWritten {
		c.m = map[string]guess[job.Status]{}
	}
	c.m[key] = guess[job.Status]{v: st.Clone(), rev: rev, ok: true}
}

func (c *statusCache) drop(key string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.m, key)
}

// deliver sends st on out, or reports false when ctx ends first.
func deliver(ctx context.Context, out chan<- job.Status, st job.Status) bool {
	select {
	case out <- st:
		return true
	case <-ctx.Done():
		return false
	}
}

func decodeStatus(data []byte) (job.Status, error) {
	var st job.Status
	if err := json.Unmarshal(data, &st); err != nil {
		return job.Status{}, fmt.Errorf("queue: decode status: %w", err)
	}
	return st, nil
}

func mustJSON(v any) []byte {
	data, err := json.Marshal(v)
	if err != nil {
		panic(err) // only plain structs are encoded here
	}
	return data
}
