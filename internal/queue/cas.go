package queue

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// casTries bounds the compare-and-set rounds of one update: each lost round means another
// writer changed the key in between, which a busy job sees a handful of times at most.
const casTries = 10

// errContention is an update that lost casTries rounds in a row.
var errContention = errors.New("too much contention")

// guess is a value and revision an update tries first instead of reading the key (the value
// a handle wrote last): a wrong guess costs one failed write, then the key is read.
type guess[T any] struct {
	v   T
	rev uint64
	ok  bool
}

// update applies change to the JSON value under key with compare-and-set, retrying while other
// writers win, and returns what the key holds afterwards with its revision. change sees the
// current value (the zero T and revision 0 when the key has none) and reports whether to write
// it; when it declines or fails, nothing is written and the current value is returned with its
// error. A bucket with no leader (a cluster electing one) answers nobody for a few seconds: the
// update waits that out, up to leaderWait, rather than lose the write.
func update[T any](ctx context.Context, kv casStore, key string, first guess[T], change func(v *T, rev uint64) (bool, error)) (T, uint64, error) {
	var zero T
	election := leaderless{until: time.Now().Add(leaderWait), pause: 100 * time.Millisecond}
	for try := 0; try < casTries; try++ {
		v, rev := first.v, first.rev
		if try > 0 || !first.ok {
			var err error
			v, rev, err = read[T](ctx, kv, key)
			if election.wait(ctx, err) {
				try--
				continue
			}
			if err != nil {
				return zero, 0, err
			}
		}
		write, err := change(&v, rev)
		if err != nil || !write {
			return v, rev, err
		}
		data, err := encode(&v)
		if err != nil {
			return zero, 0, fmt.Errorf("queue: encode %s: %w", key, err)
		}
		if rev == 0 {
			rev, err = kv.Create(ctx, key, data)
		} else {
			rev, err = kv.Update(ctx, key, data, rev)
		}
		switch {
		case err == nil:
			return v, rev, nil
		case election.wait(ctx, err):
			try--
		case !errors.Is(err, jetstream.ErrKeyExists) && !isWrongSequence(err):
			return zero, 0, fmt.Errorf("queue: write %s: %w", key, err)
		}
	}
	return zero, 0, fmt.Errorf("queue: write %s: %w", key, errContention)
}

// encode is v as json.Marshal writes it: by v's own encoder where it has one (job.Status,
// written twice a job), which must write the same bytes.
func encode[T any](v *T) ([]byte, error) {
	if a, ok := any(v).(interface{ AppendJSON([]byte) ([]byte, error) }); ok {
		return a.AppendJSON(make([]byte, 0, 512))
	}
	return json.Marshal(v)
}

// casStore is what update writes: a bucket, or a key of a shared one (sharedBucket).
type casStore interface {
	getter
	Create(ctx context.Context, key string, value []byte, opts ...jetstream.KVCreateOpt) (uint64, error)
	Update(ctx context.Context, key string, value []byte, revision uint64) (uint64, error)
}

// read returns the JSON value under key and its revision: the zero T and revision 0 when the
// key has none (never written, deleted or purged).
func read[T any](ctx context.Context, kv getter, key string) (T, uint64, error) {
	var v T
	e, err := kv.Get(ctx, key)
	switch {
	case errors.Is(err, jetstream.ErrKeyNotFound):
		return v, 0, nil
	case err != nil:
		return v, 0, fmt.Errorf("queue: read %s: %w", key, err)
	}
	if err := json.Unmarshal(e.Value(), &v); err != nil {
		return v, 0, fmt.Errorf("queue: decode %s: %w", key, err)
	}
	if k, ok := any(v).(keyed); ok {
		if err := k.checkKey(key); err != nil {
			return v, 0, fmt.Errorf("queue: read %s: %w", key, err)
		}
	}
	return v, e.Revision(), nil
}

// keyed is a value that names the key it belongs under, which read holds it to: a body is
// written by whoever may write the key, and may claim anything.
type keyed interface {
	checkKey(key string) error
}

// leaderWait bounds how long a write waits for its bucket to elect a leader: an election takes
// seconds, and a worker on a busy machine may see it take ten times as long.
const leaderWait = 30 * time.Second

// leaderless waits out a bucket that answers nobody while it elects a leader.
type leaderless struct {
	until time.Time
	pause time.Duration
}

// wait reports whether err says nobody answered (no leader, or the request timed out waiting
// for one) and, if so and time is left, sleeps before the next try.
func (l *leaderless) wait(ctx context.Context, err error) bool {
	if err == nil || !errors.Is(err, jetstream.ErrNoStreamResponse) && !errors.Is(err, nats.ErrNoResponders) && !errors.Is(err, nats.ErrTimeout) {
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

func isWrongSequence(err error) bool {
	var apiErr *jetstream.APIError
	return errors.As(err, &apiErr) && apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequence
}
