package queue

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/boxcar-run/boxcar/internal/job"
)

// ListStatuses returns the current status of every job the status bucket holds that keep
// accepts (nil keeps all), newest first by the time it was queued. It lists the tenant's keys
// from the bucket's stream and reads each by a direct get (read.go: no consumer); a record
// that does not decode is skipped.
func (c *Client) ListStatuses(ctx context.Context, keep func(job.Status) bool) ([]job.Status, error) {
	entries, err := listEntries(ctx, c.js, c.status.KeyValue, c.tenant+".*")
	if err != nil {
		return nil, fmt.Errorf("queue: list jobs: %w", err)
	}
	var out []job.Status
	for _, e := range entries {
		st, err := decodeStatus(e.Value())
		if err != nil {
			continue
		}
		st.ID = refOf(e.Key()).ID
		if keep == nil || keep(st) {
			out = append(out, st)
		}
	}
	queued, err := c.queued(ctx, out)
	if err != nil {
		return nil, err
	}
	for _, st := range queued {
		if keep == nil || keep(st) {
			out = append(out, st)
		}
	}
	sort.SliceStable(out, func(i, j int) bool { return newer(out[i], out[j]) })
	return out, nil
}

// queued returns the jobs of the client's tenant that are in the job stream with no status
// yet (none in known): queued, no worker has taken them. The stream tells their subjects only.
func (c *Client) queued(ctx context.Context, known []job.Status) ([]job.Status, error) {
	if c.jobs == nil {
		return nil, nil
	}
	filter := tenantFilter(c.cfg, c.tenant)
	info, err := c.jobs.Info(ctx, jetstream.WithSubjectFilter(filter))
	if err != nil {
		return nil, fmt.Errorf("queue: list jobs: look up stream %s: %w", jobStream(c.cfg, c.tenant), err)
	}
	has := make(map[string]bool, len(known))
	for _, st := range known {
		has[st.ID] = true
	}
	prefix := c.cfg.Subject + "." + c.tenant + "."
	var out []job.Status
	for subject := range info.State.Subjects {
		id := strings.TrimPrefix(subject, prefix)
		if has[id] || !job.ValidID(id) {
			continue
		}
		out = append(out, job.Status{ID: id, State: job.StateQueued, QueuedAt: idTime(id)})
	}
	return out, nil
}

// idTime is when a job id made by job.NewID was made (its first 15 characters); zero for an
// id of another shape.
func idTime(id string) time.Time {
	if len(id) < 15 {
		return time.Time{}
	}
	t, err := time.Parse("20060102t150405", id[:15])
	if err != nil {
		return time.Time{}
	}
	return t
}

// newer orders jobs newest first: by when they were queued, then by id (ids start with the
// time they were made).
func newer(a, b job.Status) bool {
	if !a.QueuedAt.Equal(b.QueuedAt) {
		return a.QueuedAt.After(b.QueuedAt)
	}
	return a.ID > b.ID
}

// StatusHistory returns the steps of a job's status that can be read, oldest first, for
// `submit logs`: the current one only. The bucket keeps earlier revisions, but the server lets
// them be read only through a consumer, which a tenant's identity may not create (read.go), or
// by a direct get with the key in the body, which it cannot scope to the tenant. A job no
// worker has taken is queued if the job stream holds it; ErrUnknownJob when it does not.
func (c *Client) StatusHistory(ctx context.Context, id string) ([]job.Status, error) {
	if !job.ValidID(id) {
		return nil, fmt.Errorf("%w: %q is not a job id", ErrUnknownJob, id)
	}
	e, err := c.status.Get(ctx, c.ref(id).key())
	switch {
	case isKeyNotFound(err):
		// No worker has written a status: queued if the stream has it, else unknown.
		st, err := c.Status(ctx, id)
		if err != nil {
			return nil, err
		}
		return []job.Status{st}, nil
	case err != nil:
		return nil, fmt.Errorf("queue: status of %s: %w", id, err)
	}
	st, err := decodeStatus(e.Value())
	if err != nil {
		return nil, nil // what no worker wrote: no step to show
	}
	st.ID = id
	return []job.Status{st}, nil
}

func isKeyNotFound(err error) bool { return errors.Is(err, jetstream.ErrKeyNotFound) }
