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
	// jobs is the tenant's job stream, to tell a queued job by its subject; nil for an identity
	// the server does not let read it (an approver), which then knows a job only by its status.
	jobs   jetstream.Stream
	status bucketReader // the tenant's statuses (statusbuckets.go)
	// sharedJobs is the shared job stream an older Boxcar queued in, read by a job's subject.
	sharedJobs *sharedStream
	// sharedApprovals is the approvals bucket older workers ask in during an upgrade.
	sharedApprovals *sharedBucket
	// sharedCancels is the cancel bucket older workers watch during an upgrade.
	sharedCancels *sharedBucket
	log           *slog.Logger
}

// NewClient binds to the tenant's job stream and status bucket; ErrNotServed when the stream
// is missing (the workers do not serve the tenant, or `worker setup` has not run since tenants
// had streams of their own), ErrNotReady when the bucket is, and both when both are. An identity the server
// does not let read the job stream (an approver) binds the status bucket alone.
func NewClient(ctx context.Context, nc *nats.Conn, cfg config.NATS, tenant string) (*Client, error) {
	js, err := newJetStream(nc)
	if err != nil {
		return nil, err
	}
	if !job.ValidTenant(tenant) {
		return nil, fmt.Errorf("queue: %q is not a tenant name (%s; --tenant, BOXCAR_TENANT)", tenant, job.TenantRule)
	}
	stream := jobStream(cfg, tenant)
	var jobs jetstream.Stream
	err = unlessRefused(ctx, nc, []string{"$JS.API.STREAM.INFO." + stream}, func(ctx context.Context) error {
		var err error
		jobs, err = js.Stream(ctx, stream)
		return err
	})
	if errors.Is(err, ErrRefused) {
		jobs, err = nil, nil
	}
	if err != nil && !errors.Is(err, jetstream.ErrStreamNotFound) {
		return nil, fmt.Errorf("queue: look up stream %s: %w", stream, err)
	}
	kv, kerr := bindStatus(ctx, js, cfg, tenant)
	switch {
	case errors.Is(err, jetstream.ErrStreamNotFound) && errors.Is(kerr, ErrNotReady):
		// Neither of the tenant's own: a tenant no worker serves, or a queue nobody set up
		// (under these names); a tenant's identity can see no more to tell which.
		return nil, fmt.Errorf("%w: %w %q, or no worker set the queue up: neither its job stream %s nor its status bucket %s exists on %s; ask the operator to add %q to tenants: in the worker config and run `worker setup`, or %s",
			ErrNotReady, ErrNotServed, tenant, stream, statusBucket(cfg, tenant), nc.ConnectedUrlRedacted(), tenant, setupHint)
	case errors.Is(err, jetstream.ErrStreamNotFound) && kerr == nil:
		return nil, fmt.Errorf("%w %q: its job stream %s does not exist on %s; ask the operator to add %q to tenants: in the worker config and run `worker setup` (an upgrade from one stream for every tenant needs it too)",
			ErrNotServed, tenant, stream, nc.ConnectedUrlRedacted(), tenant)
	case kerr != nil:
		return nil, kerr
	}
	status := bucketReader{KeyValue: kv, shared: newSharedBucket(js, cfg.StatusBucket, "status")}
	return &Client{js: js, cfg: cfg, tenant: tenant, jobs: jobs, status: status, sharedJobs: &sharedStream{nc: nc, name: cfg.Stream},
		sharedApprovals: newSharedBucket(js, cfg.ApprovalsBucket, "approvals"), sharedCancels: newSharedBucket(js, CancelBucket, "cancel"),
		log: slog.New(slog.DiscardHandler)}, nil
}

// bindStatus binds the tenant's status bucket. An identity of another tenant is refused its
// info, and said so at once.
func bindStatus(ctx context.Context, js jetstream.JetStream, cfg config.NATS, tenant string) (jetstream.KeyValue, error) {
	name := statusBucket(cfg, tenant)
	var kv jetstream.KeyValue
	err := unlessRefused(ctx, js.Conn(), []string{"$JS.API.STREAM.INFO." + statusStream(name)}, func(ctx context.Context) error {
		var err error
		kv, err = bucket(ctx, js, name, "status")
		return err
	})
	return kv, err
}

// Tenant is the tenant the client acts for.
func (c *Client) Tenant() string { return c.tenant }

// ref names a job of the client's tenant.
func (c *Client) ref(id string) Ref { return Ref{Tenant: c.tenant, ID: id} }

// Publish sends a job on its tenant's subject, boxcar.jobs.T.J. The job stream holds one
// message per subject, so a second publish of a job that is queued or running is refused by
// the server; duplicate reports that case. A job that already ran may be published again: the
// worker finds its committed run, or its final status, and runs nothing. Nothing else is
// written: the job is queued while it is in the stream and no worker has written its status.
func (c *Client) Publish(ctx context.Context, j job.Job) (duplicate bool, err error) {
	p, err := c.PublishAsync(j)
	if err != nil {
		return false, err
	}
	return p.Wait(ctx)
}

// ConsumerAckWait is the ack deadline of the workers' durable consumer as the server has it. A
// client's own configuration holds only the defaults, which a worker's config may have changed.
func (c *Client) ConsumerAckWait(ctx context.Context) (time.Duration, error) {
	cons, err := c.js.Consumer(ctx, jobStream(c.cfg, c.tenant), consumerName(c.cfg, c.tenant))
	if err != nil {
		return 0, fmt.Errorf("queue: look up consumer %s: %w", consumerName(c.cfg, c.tenant), err)
	}
	return cons.CachedInfo().Config.AckWait, nil
}

// Status returns what the status bucket holds for a job, with CancelRequested set when a
// cancel was asked for and the job has not ended. A job no worker has written a status for yet
// is queued while its message is in the job stream; ErrUnknownJob when it is not there either.
func (c *Client) Status(ctx context.Context, id string) (job.Status, error) {
	r := c.ref(id)
	st, err := getStatus(ctx, c.status, r)
	if errors.Is(err, ErrUnknownJob) && job.ValidID(id) {
		var queued bool
		if queued, err = c.inStream(ctx, r); err == nil && !queued {
			err = fmt.Errorf("%w: %s", ErrUnknownJob, id)
		}
		st = job.Status{ID: id, State: job.StateQueued}
	}
	if err != nil {
		return job.Status{}, err
	}
	if !st.State.Terminal() && !st.CancelRequested {
		if st.CancelRequested, err = c.cancelRequested(ctx, r); err != nil {
			return job.Status{}, err
		}
	}
	return st, nil
}

// inStream reports whether the tenant's job stream holds a message on the job's subject, or,
// while an upgrade drains it, the shared job stream (inShared): one no worker has settled. It
// asks for the count of the one subject, never for the message.
func (c *Client) inStream(ctx context.Context, r Ref) (bool, error) {
	if c.jobs == nil {
		return false, nil
	}
	queued, err := inStream(ctx, c.jobs, c.cfg, r)
	if queued || err != nil {
		return queued, err
	}
	return c.inShared(ctx, r)
}

// sharedLook bounds a look at the shared job stream, as the JetStream client bounds its
// requests.
const sharedLook = 5 * time.Second

// inShared reports whether the shared job stream holds the job: one an older Boxcar queued
// there, which the tenant's consumer on it delivers until the upgrade drained it (drain.go).
// Before, `submit status` called such a job unknown, `cancel` refused it and `watch` gave up
// on it. The stream's info would list every tenant's jobs, so a tenant's identity reads it by a
// direct get of the job's one subject, which its permissions name (natsconfig). No server
// answering (no shared stream, or one that `worker setup` of this version has not given direct
// gets yet) and a refusal (credentials generated before that grant) are no job there, learned
// once (sharedStream).
func (c *Client) inShared(ctx context.Context, r Ref) (bool, error) {
	msg, err := c.sharedJobs.get(ctx, jobSubject(c.cfg, r))
	if err != nil {
		return false, fmt.Errorf("queue: look up job %s in the shared stream %s: %w", r.ID, c.cfg.Stream, err)
	}
	return msg != nil, nil
}

// inStream asks the job stream for the count of the job's one subject.
func inStream(ctx context.Context, jobs jetstream.Stream, cfg config.NATS, r Ref) (bool, error) {
	subject := jobSubject(cfg, r)
	info, err := jobs.Info(ctx, jetstream.WithSubjectFilter(subject))
	if err != nil {
		return false, fmt.Errorf("queue: look up job %s in stream %s: %w", r.ID, jobs.CachedInfo().Config.Name, err)
	}
	return info.State.Subjects[subject] > 0, nil
}

// WatchStatus streams a job's status: the current value first (queued for a job in the job
// stream with no status yet), then each change seen, until ctx ends or the job reaches a
// terminal state (the last value sent). A job unknown for UnknownGrace (no status, not in the
// job stream: never submitted, not this tenant's, or gone from the stream before any worker
// wrote its status, whether or not it was sent as queued) ends the watch with nothing more
// sent; the caller, seeing the channel closed before ctx ended and no terminal state, says it
// is unknown (ErrUnknownJob). It reads the status every pollEvery with a direct get, never
// with a consumer (read.go): a step written and replaced between two reads is not seen, the
// terminal one always is.
func (c *Client) WatchStatus(ctx context.Context, id string) (<-chan job.Status, error) {
	if !job.ValidID(id) {
		return nil, fmt.Errorf("queue: watch %s: %w: %q is not a job id", id, ErrUnknownJob, id)
	}
	out := make(chan job.Status)
	go c.pollStatuses(ctx, []string{id}, out)
	return out, nil
}

// TenantLag is the client's tenant's share of the queue as its consumer holds it: jobs not
// delivered yet, jobs in flight, and the most that may be (the tenant's max_concurrent).
type TenantLag struct {
	Pending, InFlight uint64
	MaxConcurrent     int
	// Shared is how many of them an older Boxcar queued in the shared job stream, which the
	// tenant's consumer there delivers while an upgrade drains it (counted in Pending and
	// InFlight too).
	Shared uint64
}

// Lag reads the client's tenant's consumer, and while an upgrade drains it its consumer on the
// shared job stream (sharedLag): what `submit status` shows of the queue.
func (c *Client) Lag(ctx context.Context) (TenantLag, error) {
	name := consumerName(c.cfg, c.tenant)
	cons, err := c.js.Consumer(ctx, jobStream(c.cfg, c.tenant), name)
	if err != nil {
		return TenantLag{}, fmt.Errorf("queue: look up consumer %s: %w", name, err)
	}
	info := cons.CachedInfo()
	l := TenantLag{Pending: info.NumPending, InFlight: uint64(max(info.NumAckPending, 0)), MaxConcurrent: info.Config.MaxAckPending}
	shared, err := c.sharedLag(ctx)
	if err != nil {
		return TenantLag{}, err
	}
	l.Pending, l.InFlight = l.Pending+shared.Pending, l.InFlight+shared.InFlight
	l.Shared = shared.Pending + shared.InFlight
	return l, nil
}

// SharedWaiting is how many of the client's tenant's jobs wait in the shared job stream, named
// stream, while an upgrade drains it (drain.go), not delivered yet: no worker has written their
// status, so ListStatuses cannot list them. A tenant's identity may not list that stream (its
// info names every tenant's jobs) and reads a job there only by its subject (inShared), so
// the count, from the tenant's consumer there, is all it can know of them.
func (c *Client) SharedWaiting(ctx context.Context) (stream string, n uint64, err error) {
	l, err := c.sharedLag(ctx)
	return c.cfg.Stream, l.Pending, err
}

// sharedLag is what the tenant's consumer on the shared job stream holds while an upgrade
// drains it (drain.go): none once drained and removed, or for credentials generated before
// the grant to read it.
func (c *Client) sharedLag(ctx context.Context) (TenantLag, error) {
	name := consumerName(c.cfg, c.tenant)
	var info *jetstream.ConsumerInfo
	err := unlessRefused(ctx, c.js.Conn(), []string{"$JS.API.CONSUMER.INFO." + c.cfg.Stream + "." + name}, func(ctx context.Context) error {
		cons, err := c.js.Consumer(ctx, c.cfg.Stream, name)
		if err == nil {
			info = cons.CachedInfo()
		}
		return err
	})
	switch {
	case errors.Is(err, ErrRefused), errors.Is(err, jetstream.ErrConsumerNotFound), errors.Is(err, jetstream.ErrStreamNotFound):
		return TenantLag{}, nil
	case err != nil:
		return TenantLag{}, fmt.Errorf("queue: look up consumer %s of the shared stream %s: %w", name, c.cfg.Stream, err)
	}
	return TenantLag{Pending: info.NumPending, InFlight: uint64(max(info.NumAckPending, 0))}, nil
}
