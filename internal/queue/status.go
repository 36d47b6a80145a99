package queue

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/boxcar-run/boxcar/internal/job"
)

// Status returns what the status bucket holds for a job; ErrUnknownJob when nothing.
func (q *Queue) Status(ctx context.Context, id string) (job.Status, error) {
	if !job.ValidID(id) {
		return job.Status{}, fmt.Errorf("%w: %q is not a job id", ErrUnknownJob, id)
	}
	e, err := q.status.Get(ctx, id)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return job.Status{}, fmt.Errorf("%w: %s", ErrUnknownJob, id)
	}
	if err != nil {
		return job.Status{}, fmt.Errorf("queue: status of %s: %w", id, err)
	}
	return decodeStatus(e.Value())
}

// UpdateStatus applies change to a job's status with compare-and-set, retrying on a concurrent
// writer, and returns the status written. A terminal status is never changed again, so a stale
// attempt cannot overwrite a final outcome.
//
// The first try starts from the status this handle wrote last for the job, when it has one: a
// worker writes a running job's status a dozen times (progress, spending, outcome), and so each
// write is one round trip, not a read and a write. If anyone else wrote in between, the
// compare-and-set fails and the next try reads the current value, as every try did before.
//
// A bucket with no leader (a node of a cluster went down and its replicas are electing one)
// answers nobody for a few seconds; the write waits that out, up to leaderWait, rather than
// leave a job's final status unwritten while its run is committed and its message acked.
func (q *Queue) UpdateStatus(ctx context.Context, id string, change func(*job.Status)) (job.Status, error) {
	election := leaderless{until: time.Now().Add(leaderWait), pause: 100 * time.Millisecond}
	for try := 0; try < 10; try++ {
		st, rev, known := q.written.get(id)
		if try > 0 || !known {
			st, rev = job.Status{}, 0
			e, err := q.status.Get(ctx, id)
			switch {
			case errors.Is(err, jetstream.ErrKeyNotFound):
				st = job.Status{ID: id}
			case election.wait(ctx, err):
				try--
				continue
			case err != nil:
				return job.Status{}, fmt.Errorf("queue: status of %s: %w", id, err)
			default:
				if st, err = decodeStatus(e.Value()); err != nil {
					return job.Status{}, err
				}
				rev = e.Revision()
			}
		}
		if st.State.Terminal() {
			return st, fmt.Errorf("%w: job %s is already %s", ErrFinal, id, st.State)
		}
		change(&st)
		st.ID = id
		st.UpdatedAt = time.Now().UTC()
		var err error
		if rev == 0 {
			rev, err = q.status.Create(ctx, id, mustJSON(st))
		} else {
			rev, err = q.status.Update(ctx, id, mustJSON(st), rev)
		}
		if err == nil {
			q.written.put(id, st, rev)
			return st, nil
		}
		q.written.drop(id)
		if election.wait(ctx, err) {
			try--
			continue
		}
		if !errors.Is(err, jetstream.ErrKeyExists) && !isWrongSequence(err) {
			return job.Status{}, fmt.Errorf("queue: update status of %s: %w", id, err)
		}
	}
	return job.Status{}, fmt.Errorf("queue: update status of %s: too much contention", id)
}

// leaderWait bounds how long a status write waits for its bucket to elect a leader: an
// election takes seconds, and a worker on a busy machine may see it take ten times as long.
const leaderWait = 30 * time.Second

// leaderless waits out a bucket that answers nobody while it elects a leader.
type leaderless struct {
	until time.Time
	pause time.Duration
}

// wait reports whether err says nobody answered (no leader, or the request timed out waiting
// for one) and, if so and time is left, sleeps before the next try.
func (l *leaderless) wait(ctx context.Context, err error) bool {
	if !errors.Is(err, jetstream.ErrNoStreamResponse) && !errors.Is(err, nats.ErrNoResponders) && !errors.Is(err, nats.ErrTimeout) {
		return false
	}
	if time.Now().Add(l.pause).After(l.until) {
		return false
	}
	select {
	case <-ctx.Done():
		return false
	case <-time.After(l.pause):
	}
	l.pause = min(2*l.pause, 2*time.Second)
	return true
}

// statusCache holds the status a handle wrote last for each job, with its revision, until
// the job ends. It only ever saves a read: a stale entry makes the compare-and-set fail.
type statusCache struct {
	mu sync.Mutex
	m  map[string]writtenStatus
}

type writtenStatus struct {
	st  job.Status
	rev uint64
}

// maxWritten bounds the cache: jobs handed back unfinished (a worker stopping) leave entries.
const maxWritten = 4096

func (c *statusCache) get(id string) (job.Status, uint64, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	w, ok := c.m[id]
	return w.st, w.rev, ok
}

func (c *statusCache) put(id string, st job.Status, rev uint64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if st.State.Terminal() {
		delete(c.m, id) // never written again
		return
	}
	if c.m == nil || len(c.m) >= maxWritten {
		c.m = map[string]writtenStatus{}
	}
	c.m[id] = writtenStatus{st: st, rev: rev}
}

func (c *statusCache) drop(id string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.m, id)
}

// WatchStatus streams a job's status: the current value first, then every change, until ctx
// ends or the job reaches a terminal state (the last value sent).
func (q *Queue) WatchStatus(ctx context.Context, id string) (<-chan job.Status, error) {
	w, err := q.status.Watch(ctx, id)
	if err != nil {
		return nil, fmt.Errorf("queue: watch %s: %w", id, err)
	}
	out := make(chan job.Status)
	go func() {
		defer close(out)
		defer func() { _ = w.Stop() }()
		follow(ctx, w, nil, func(st job.Status) bool { return deliver(ctx, out, st) && !st.State.Terminal() })
	}()
	return out, nil
}

// WatchChanges streams the status changes made from now on to the jobs keep accepts, until ctx
// ends or the watch breaks (the channel closes; watch again, and read what changed in
// between). One watch serves any number of jobs: a worker follows all the jobs it runs with
// one consumer instead of making and removing one per job. keep sees the key before the value
// is decoded, so another worker's jobs cost this one little more than their delivery.
func (q *Queue) WatchChanges(ctx context.Context, keep func(id string) bool) (<-chan job.Status, error) {
	w, err := q.status.WatchAll(ctx, jetstream.UpdatesOnly(), jetstream.IgnoreDeletes())
	if err != nil {
		return nil, fmt.Errorf("queue: watch the status bucket: %w", err)
	}
	out := make(chan job.Status)
	go func() {
		defer close(out)
		defer func() { _ = w.Stop() }()
		follow(ctx, w, keep, func(st job.Status) bool { return deliver(ctx, out, st) })
	}()
	return out, nil
}

// follow hands each status the watcher puts to send, until send returns false, ctx ends or the
// watcher stops. Deletes, the marker after the initial values, records that do not decode and
// the keys keep refuses (looked at before the value is decoded; nil keeps every key) are
// skipped.
func follow(ctx context.Context, w jetstream.KeyWatcher, keep func(id string) bool, send func(job.Status) bool) {
	for {
		select {
		case <-ctx.Done():
			return
		case e, ok := <-w.Updates():
			if !ok {
				return
			}
			if e == nil || e.Operation() != jetstream.KeyValuePut || (keep != nil && !keep(e.Key())) {
				continue
			}
			st, err := decodeStatus(e.Value())
			if err != nil {
				continue
			}
			st.ID = e.Key()
			if !send(st) {
				return
			}
		}
	}
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

func isWrongSequence(err error) bool {
	var apiErr *jetstream.APIError
	return errors.As(err, &apiErr) && apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequence
}

func mustJSON(v any) []byte {
	data, err := json.Marshal(v)
	if err != nil {
		panic(err) // only plain structs are encoded here
	}
	return data
}
