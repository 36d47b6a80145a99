package queue

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/boxcar-run/boxcar/internal/config"
	"github.com/boxcar-run/boxcar/internal/job"
)

// Client is a submitter's (or an approver's) handle, acting for one tenant: it publishes jobs,
// reads and watches their statuses, asks for a cancel and answers approvals. It binds to what
// an Admin declared and creates nothing, so a client never races a worker's settings.
type Client struct {
	js     jetstream.JetStream
	cfg    config.NATS
	tenant string
	status jetstream.KeyValue
	log    *slog.Logger
}

// NewClient binds to the job stream and the status bucket for tenant; ErrNotReady when either
// is missing.
func NewClient(ctx context.Context, nc *nats.Conn, cfg config.NATS, tenant string) (*Client, error) {
	js, err := newJetStream(nc)
	if err != nil {
		return nil, err
	}
	if _, err := js.Stream(ctx, cfg.Stream); err != nil {
		if errors.Is(err, jetstream.ErrStreamNotFound) {
			return nil, fmt.Errorf("%w: stream %s does not exist on %s; %s", ErrNotReady, cfg.Stream, nc.ConnectedUrlRedacted(), setupHint)
		}
		return nil, fmt.Errorf("queue: look up stream %s: %w", cfg.Stream, err)
	}
	kv, err := bucket(ctx, js, cfg.StatusBucket, "status")
	if err != nil {
		return nil, err
	}
	return &Client{js: js, cfg: cfg, tenant: tenant, status: kv, log: slog.New(slog.DiscardHandler)}, nil
}

// Tenant is the tenant the client acts for.
func (c *Client) Tenant() string { return c.tenant }

// ref names a job of the client's tenant.
func (c *Client) ref(id string) Ref { return Ref{Tenant: c.tenant, ID: id} }

// Publish sends a job. The job id is the message id, so a second publish of the same id inside
// the duplicate window is dropped by the server; duplicate reports that case.
func (c *Client) Publish(ctx context.Context, j job.Job) (duplicate bool, err error) {
	data, err := j.Encode()
	if err != nil {
		return false, err
	}
	now := time.Now().UTC()
	key := c.ref(j.ID).key()
	rev, err := c.status.Create(ctx, key, mustJSON(job.Status{ID: j.ID, State: job.StateQueued, Profile: j.Profile, Labels: j.Labels, QueuedAt: now, UpdatedAt: now}))
	if err != nil && !errors.Is(err, jetstream.ErrKeyExists) {
		return false, fmt.Errorf("queue: record job %s as queued: %w", j.ID, err)
	}
	ack, err := c.js.Publish(ctx, c.cfg.Subject, data, jetstream.WithMsgID(j.ID), jetstream.WithExpectStream(c.cfg.Stream))
	if err != nil {
		var refused *jetstream.APIError
		if rev > 0 && errors.As(err, &refused) {
			// The stream refused the job (full: job_max_msgs or job_max_bytes): it was never
			// queued, so neither is its status.
			_ = c.status.Delete(ctx, key, jetstream.LastRevision(rev))
		}
		return false, fmt.Errorf("queue: publish job %s: %w", j.ID, err)
	}
	return ack.Duplicate, nil
}

// DuplicateWindow is the job stream's duplicate window as the server holds it: a job id
// published again inside it is dropped. Clients that retry a publish stay inside it.
func (c *Client) DuplicateWindow(ctx context.Context) (time.Duration, error) {
	s, err := c.js.Stream(ctx, c.cfg.Stream)
	if err != nil {
		return 0, fmt.Errorf("queue: look up stream %s: %w", c.cfg.Stream, err)
	}
	return s.CachedInfo().Config.Duplicates, nil
}

// ConsumerAckWait is the ack deadline of the workers' durable consumer as the server has it. A
// client's own configuration holds only the defaults, which a worker's config may have changed.
func (c *Client) ConsumerAckWait(ctx context.Context) (time.Duration, error) {
	cons, err := c.js.Consumer(ctx, c.cfg.Stream, c.cfg.Consumer)
	if err != nil {
		return 0, fmt.Errorf("queue: look up consumer %s: %w", c.cfg.Consumer, err)
	}
	return cons.CachedInfo().Config.AckWait, nil
}

// Status returns what the status bucket holds for a job; ErrUnknownJob when nothing.
func (c *Client) Status(ctx context.Context, id string) (job.Status, error) {
	return getStatus(ctx, c.status, c.ref(id))
}

// Cancel asks for a job to be cancelled and returns its status after the request: a job that
// has not started is cancelled at once, a running one is asked to stop (job.RequestCancel).
func (c *Client) Cancel(ctx context.Context, id string) (job.Status, error) {
	if !job.ValidID(id) {
		return job.Status{}, fmt.Errorf("%w: %q is not a job id", ErrUnknownJob, id)
	}
	st, _, err := update(ctx, c.status, c.ref(id).key(), guess[job.Status]{}, func(st *job.Status, _ uint64) (bool, error) {
		if st.State.Terminal() {
			return false, fmt.Errorf("%w: job %s is already %s", ErrFinal, id, st.State)
		}
		job.RequestCancel(st)
		st.ID, st.UpdatedAt = id, time.Now().UTC()
		return true, nil
	})
	if err != nil && !errors.Is(err, ErrFinal) {
		return job.Status{}, fmt.Errorf("queue: cancel %s: %w", id, err)
	}
	return st, err
}

// WatchStatus streams a job's status: the current value first, then every change, until ctx
// ends or the job reaches a terminal state (the last value sent).
func (c *Client) WatchStatus(ctx context.Context, id string) (<-chan job.Status, error) {
	w, err := c.status.Watch(ctx, c.ref(id).key())
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
