package queue

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

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
func (q *Queue) UpdateStatus(ctx context.Context, id string, change func(*job.Status)) (job.Status, error) {
	for range 10 {
		var (
			st  job.Status
			rev uint64
		)
		e, err := q.status.Get(ctx, id)
		switch {
		case errors.Is(err, jetstream.ErrKeyNotFound):
			st = job.Status{ID: id}
		case err != nil:
			return job.Status{}, fmt.Errorf("queue: status of %s: %w", id, err)
		default:
			if st, err = decodeStatus(e.Value()); err != nil {
				return job.Status{}, err
			}
			rev = e.Revision()
		}
		if st.State.Terminal() {
			return st, fmt.Errorf("%w: job %s is already %s", ErrFinal, id, st.State)
		}
		change(&st)
		st.ID = id
		st.UpdatedAt = time.Now().UTC()
		if rev == 0 {
			_, err = q.status.Create(ctx, id, mustJSON(st))
		} else {
			_, err = q.status.Update(ctx, id, mustJSON(st), rev)
		}
		if err == nil {
			return st, nil
		}
		if !errors.Is(err, jetstream.ErrKeyExists) && !isWrongSequence(err) {
			return job.Status{}, fmt.Errorf("queue: update status of %s: %w", id, err)
		}
	}
	return job.Status{}, fmt.Errorf("queue: update status of %s: too much contention", id)
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
		defer w.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case e, ok := <-w.Updates():
				if !ok {
					return
				}
				if e == nil || e.Operation() != jetstream.KeyValuePut {
					continue // nil marks the end of the initial values
				}
				st, err := decodeStatus(e.Value())
				if err != nil {
					continue
				}
				select {
				case out <- st:
				case <-ctx.Done():
					return
				}
				if st.State.Terminal() {
					return
				}
			}
		}
	}()
	return out, nil
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
