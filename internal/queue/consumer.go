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
)

// Consumer is a worker's handle: it fetches and settles jobs, writes their statuses, asks for
// approvals and advertises the worker's profiles. It binds to what an Admin declared.
type Consumer struct {
	js        jetstream.JetStream
	cfg       config.NATS
	log       *slog.Logger
	cons      jetstream.Consumer
	status    jetstream.KeyValue
	approvals jetstream.KeyValue
	written   statusCache // the statuses this handle wrote last (status.go)
	// admin, when the worker has the operator's rights, declares the streams again when NATS
	// lost them; nil for a worker that only binds.
	admin *Admin
}

// NewConsumer binds to the job stream, its consumer and the buckets. It creates nothing: a
// missing one is ErrNotReady, naming `worker setup`. admin, when not nil, sets them up again
// should NATS lose them while the worker runs.
func NewConsumer(ctx context.Context, nc *nats.Conn, cfg config.NATS, log *slog.Logger, admin *Admin) (*Consumer, error) {
	js, err := newJetStream(nc)
	if err != nil {
		return nil, err
	}
	c := &Consumer{js: js, cfg: cfg, log: log, admin: admin}
	c.cons, err = js.Consumer(ctx, cfg.Stream, cfg.Consumer)
	switch {
	case errors.Is(err, jetstream.ErrStreamNotFound), errors.Is(err, jetstream.ErrConsumerNotFound):
		return nil, fmt.Errorf("%w: consumer %s of stream %s does not exist on %s; %s", ErrNotReady, cfg.Consumer, cfg.Stream, nc.ConnectedUrlRedacted(), setupHint)
	case err != nil:
		return nil, fmt.Errorf("queue: look up consumer %s: %w", cfg.Consumer, err)
	}
	if c.status, err = bucket(ctx, js, cfg.StatusBucket, "status"); err != nil {
		return nil, err
	}
	if c.approvals, err = bucket(ctx, js, cfg.ApprovalsBucket, "approvals"); err != nil {
		return nil, err
	}
	return c, nil
}

// Open declares everything (as an operator) and binds a Consumer to it: what a worker with the
// operator's rights does at start.
func Open(ctx context.Context, nc *nats.Conn, cfg config.NATS, log *slog.Logger) (*Consumer, error) {
	admin, err := NewAdmin(nc, cfg, log)
	if err != nil {
		return nil, err
	}
	if err := admin.Declare(ctx); err != nil {
		return nil, err
	}
	return NewConsumer(ctx, nc, cfg, log, admin)
}

// Fetch waits for the next job and returns its delivery. It returns only when a message
// arrives or ctx ends, so callers fetch only when they have a free slot.
func (c *Consumer) Fetch(ctx context.Context) (*Delivery, error) {
	failing := false // a failure was logged: say once when fetching works again
	for {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		// Short pulls keep the request alive across server restarts and leader changes.
		pullCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
		msg, err := c.cons.Next(jetstream.FetchContext(pullCtx))
		cancel()
		if failing && (err == nil || isPullTimeout(err)) {
			failing = false
			c.log.InfoContext(ctx, "fetching jobs again")
		}
		switch {
		case err == nil:
			return c.delivery(msg)
		case ctx.Err() != nil:
			return nil, ctx.Err()
		case isPullTimeout(err):
			c.redeclareIfGone(ctx)
			continue
		default:
			c.redeclareIfGone(ctx)
			// Once per outage, not once a second: the connection's own log says more.
			if !failing {
				failing = true
				c.log.WarnContext(ctx, "fetch failed; retrying every second", "error", err)
			} else {
				c.log.DebugContext(ctx, "fetch failed again", "error", err)
			}
			select {
			case <-ctx.Done():
				return nil, ctx.Err()
			case <-time.After(time.Second):
			}
		}
	}
}

// redeclareIfGone sets the streams, consumer and buckets up again when the job stream or its
// consumer is gone: NATS came back without its data (a server whose storage was lost, or an
// operator who removed them). The handles this queue holds go on working on the new ones, as
// they are found by name. A worker without the operator's rights says what to run instead.
func (c *Consumer) redeclareIfGone(ctx context.Context) {
	_, err := c.js.Consumer(ctx, c.cfg.Stream, c.cfg.Consumer)
	if !errors.Is(err, jetstream.ErrStreamNotFound) && !errors.Is(err, jetstream.ErrConsumerNotFound) {
		return
	}
	if c.admin == nil {
		c.log.ErrorContext(ctx, "the job stream or its consumer is gone from NATS; run `worker setup` with an operator identity", "stream", c.cfg.Stream, "consumer", c.cfg.Consumer, "error", err)
		return
	}
	c.log.WarnContext(ctx, "the job stream or its consumer is gone from NATS; setting them up again", "stream", c.cfg.Stream, "consumer", c.cfg.Consumer, "error", err)
	if err := c.admin.Declare(ctx); err != nil {
		c.log.ErrorContext(ctx, "set up the job stream again failed; trying at the next fetch", "error", err)
		return
	}
	c.log.InfoContext(ctx, "job stream and consumer set up again")
}

// isPullTimeout reports a pull that ended with nothing to deliver, which is no failure.
func isPullTimeout(err error) bool {
	return errors.Is(err, nats.ErrTimeout) || errors.Is(err, context.DeadlineExceeded) || errors.Is(err, jetstream.ErrNoHeartbeat)
}

func (c *Consumer) delivery(msg jetstream.Msg) (*Delivery, error) {
	meta, err := msg.Metadata()
	if err != nil {
		return nil, fmt.Errorf("queue: message metadata: %w", err)
	}
	return &Delivery{
		msg:       msg,
		c:         c,
		JobID:     msg.Headers().Get(jetstream.MsgIDHeader),
		Data:      msg.Data(),
		Attempt:   int(meta.NumDelivered),
		Published: meta.Timestamp,
		Seq:       meta.Sequence.Stream,
	}, nil
}

// AckWait is the consumer's ack deadline; heartbeats keep a running job inside it.
func (c *Consumer) AckWait() time.Duration { return time.Duration(c.cfg.AckWait) }

// ConsumerLag reports, from the server's view of the workers' durable consumer, how many jobs
// wait to be delivered (pending) and how many are delivered but not yet acknowledged
// (ackPending). Both are cluster-wide: every worker sees the same numbers.
func (c *Consumer) ConsumerLag(ctx context.Context) (pending, ackPending uint64, err error) {
	info, err := c.cons.Info(ctx)
	if err != nil {
		return 0, 0, fmt.Errorf("queue: look up consumer %s: %w", c.cfg.Consumer, err)
	}
	return info.NumPending, uint64(max(info.NumAckPending, 0)), nil
}
