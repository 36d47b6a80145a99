package queue

import (
	"context"
	"errors"
	"fmt"
	"sort"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/boxcar-run/boxcar/internal/job"
)

// ListStatuses returns the current status of every job the status bucket holds that keep
// accepts (nil keeps all), newest first by the time it was queued. It reads the bucket with one
// watcher (one consumer, no request per job); a record that does not decode is skipped.
func (c *Client) ListStatuses(ctx context.Context, keep func(job.Status) bool) ([]job.Status, error) {
	w, err := c.status.WatchAll(ctx, jetstream.IgnoreDeletes())
	if err != nil {
		return nil, fmt.Errorf("queue: list jobs: %w", err)
	}
	defer w.Stop() //nolint:errcheck // nothing to do about it
	var out []job.Status
	for {
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("queue: list jobs: %w", ctx.Err())
		case e, ok := <-w.Updates():
			if !ok {
				return nil, fmt.Errorf("queue: list jobs: the watch ended")
			}
			if e == nil { // every current value seen
				sort.SliceStable(out, func(i, j int) bool { return newer(out[i], out[j]) })
				return out, nil
			}
			st, err := decodeStatus(e.Value())
			if err != nil {
				continue
			}
			st.ID = refOf(e.Key()).ID
			if keep == nil || keep(st) {
				out = append(out, st)
			}
		}
	}
}

// newer orders jobs newest first: by when they were queued, then by id (ids start with the
// time they were made).
func newer(a, b job.Status) bool {
	if !a.QueuedAt.Equal(b.QueuedAt) {
		return a.QueuedAt.After(b.QueuedAt)
	}
	return a.ID > b.ID
}

// StatusHistory returns the revisions of a job's status the bucket still keeps (at most its
// history, 16), oldest first: the steps a job went through, for `submit logs`.
func (c *Client) StatusHistory(ctx context.Context, id string) ([]job.Status, error) {
	if !job.ValidID(id) {
		return nil, fmt.Errorf("%w: %q is not a job id", ErrUnknownJob, id)
	}
	entries, err := c.status.History(ctx, c.ref(id).key())
	if err != nil {
		if isKeyNotFound(err) {
			return nil, fmt.Errorf("%w: %s", ErrUnknownJob, id)
		}
		return nil, fmt.Errorf("queue: status history of %s: %w", id, err)
	}
	var out []job.Status
	for _, e := range entries {
		if e.Operation() != jetstream.KeyValuePut {
			continue
		}
		if st, err := decodeStatus(e.Value()); err == nil {
			st.ID = id
			out = append(out, st)
		}
	}
	return out, nil
}

func isKeyNotFound(err error) bool { return errors.Is(err, jetstream.ErrKeyNotFound) }
