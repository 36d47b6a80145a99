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

// Admin declares what workers and clients bind to: the job stream and its consumer, the
// dead-letter stream and the status and approvals buckets. It needs the operator's rights
// ($JS.API.STREAM.CREATE and the like); a worker without them binds to what an Admin made.
type Admin struct {
	js  jetstream.JetStream
	cfg config.NATS
	log *slog.Logger
}

// NewAdmin returns an Admin on the connection; it declares nothing until Declare.
func NewAdmin(nc *nats.Conn, cfg config.NATS, log *slog.Logger) (*Admin, error) {
	js, err := newJetStream(nc)
	if err != nil {
		return nil, err
	}
	return &Admin{js: js, cfg: cfg, log: log}, nil
}

// Declare creates or updates the streams, the consumer and the buckets. It is safe to call from
// every worker at start and again at any time: a limit an operator edited is kept (streams.go).
func (a *Admin) Declare(ctx context.Context) error {
	cfg := a.cfg
	stream, err := a.declareStreams(ctx)
	if err != nil {
		return err
	}
	if err := a.declareConsumer(ctx, stream); err != nil {
		return err
	}
	if _, err := setUpStatus(ctx, a.js, cfg, a.log); err != nil {
		return fmt.Errorf("queue: set up status bucket %s: %w", cfg.StatusBucket, err)
	}
	return setUpApprovals(ctx, a.js, cfg)
}

// declareStreams creates or updates the job stream and the dead-letter stream.
func (a *Admin) declareStreams(ctx context.Context) (jetstream.Stream, error) {
	cfg := a.cfg
	jobs := jetstream.StreamConfig{
		Name:        cfg.Stream,
		Description: "Boxcar jobs",
		Subjects:    []string{cfg.Subject},
		Retention:   jetstream.WorkQueuePolicy,
		Storage:     jetstream.FileStorage,
		Replicas:    cfg.Replicas,
		Duplicates:  time.Duration(cfg.DuplicateWindow),
		MaxMsgSize:  job.MaxMessageBytes + 4096, // room for headers
		MaxMsgs:     orUnlimited(cfg.JobMaxMsgs),
		MaxBytes:    orUnlimited(cfg.JobMaxBytes),
		// A full queue refuses the submission, which submit reports; it never drops a job
		// that was accepted.
		Discard: jetstream.DiscardNew,
	}
	// What workers before the retention settings set, to tell their values from an operator's.
	jobsBefore := jobs
	jobsBefore.MaxMsgs, jobsBefore.MaxBytes, jobsBefore.Discard = -1, -1, jetstream.DiscardOld
	stream, err := ensureStream(ctx, a.js, jobs, jobsBefore, a.log)
	if err != nil {
		return nil, fmt.Errorf("queue: set up stream %s: %w (if the stream exists with incompatible settings, remove it with `nats stream rm %s` after draining it)", cfg.Stream, err, cfg.Stream)
	}
	dead := jetstream.StreamConfig{
		Name:        cfg.DeadLetterStream,
		Description: "Boxcar jobs that can never run, with the reason",
		Subjects:    []string{dlqSubject(cfg, "*")},
		Storage:     jetstream.FileStorage,
		Replicas:    cfg.Replicas,
		MaxAge:      time.Duration(cfg.DeadLetterMaxAge),
		MaxBytes:    orUnlimited(cfg.DeadLetterMaxBytes),
		MaxMsgs:     -1,
		Duplicates:  2 * time.Minute, // the server's default, written out to compare with
		Discard:     jetstream.DiscardOld,
	}
	deadBefore := dead
	deadBefore.MaxAge, deadBefore.MaxBytes = 30*24*time.Hour, -1
	if _, err := ensureStream(ctx, a.js, dead, deadBefore, a.log); err != nil {
		return nil, fmt.Errorf("queue: set up dead-letter stream %s: %w", cfg.DeadLetterStream, err)
	}
	return stream, nil
}

// declareConsumer creates or updates the workers' durable consumer.
func (a *Admin) declareConsumer(ctx context.Context, stream jetstream.Stream) error {
	cfg := a.cfg
	var before *jetstream.ConsumerConfig
	if c, err := stream.Consumer(ctx, cfg.Consumer); err == nil {
		before = &c.CachedInfo().Config
	} else if !errors.Is(err, jetstream.ErrConsumerNotFound) {
		return fmt.Errorf("queue: look up consumer %s: %w", cfg.Consumer, err)
	}
	cons, err := stream.CreateOrUpdateConsumer(ctx, jetstream.ConsumerConfig{
		Durable:     cfg.Consumer,
		Description: "Boxcar workers",
		AckPolicy:   jetstream.AckExplicitPolicy,
		AckWait:     time.Duration(cfg.AckWait),
		// Unbounded on the server: the worker decides from the delivery count (see
		// Delivery.Exhausted), so a job whose last delivery died is delivered once more and
		// dead-lettered by whoever gets it, even when every worker was down at the time. The
		// server's own max-deliveries end is an at-most-once advisory that nothing stores.
		MaxDeliver:    -1,
		MaxAckPending: cfg.MaxAckPending,
		Replicas:      cfg.Replicas,
	})
	if err != nil {
		return fmt.Errorf("queue: set up consumer %s: %w (if it cannot be updated, remove it with `nats consumer rm %s %s` while no worker runs; jobs stay in the stream)", cfg.Consumer, err, cfg.Stream, cfg.Consumer)
	}
	if before != nil && before.MaxDeliver > 0 {
		if err := redeliverDropped(ctx, a.js, stream, cons, before.MaxDeliver, a.log); err != nil {
			return fmt.Errorf("queue: consumer %s: deliver again the jobs its old max_deliver of %d dropped: %w", cfg.Consumer, before.MaxDeliver, err)
		}
	}
	return nil
}

// redeliverDropped repairs a consumer that an older Boxcar created with a finite MaxDeliver,
// now unbounded. The server stopped delivering each job that reached that count, and an
// update does not bring those back: they sit in the work-queue stream, which holds only jobs
// no one has settled, but no delivery will ever come. When the stream holds more jobs than the
// consumer has pending or in flight, the consumer is reset to the stream's first job, so that
// every job in it is delivered again, counting from 1; a job in flight on another worker is
// then delivered twice, which the run's create-only manifest makes harmless (one commits, the
// other finds it committed or loses the commit).
func redeliverDropped(ctx context.Context, js jetstream.JetStream, stream jetstream.Stream, cons jetstream.Consumer, old int, log *slog.Logger) error {
	// The stream first: a job settled between the two reads makes the count too high, which
	// costs a reset, never too low, which would leave a job behind.
	sinfo, err := stream.Info(ctx)
	if err != nil {
		return err
	}
	cinfo, err := cons.Info(ctx)
	if err != nil {
		return err
	}
	live := cinfo.NumPending + uint64(cinfo.NumAckPending)
	log.Warn("the job consumer had a finite max_deliver, set by an older Boxcar; it is now unbounded, and the worker counts deliveries itself",
		"consumer", cinfo.Name, "old_max_deliver", old)
	if sinfo.State.Msgs <= live {
		return nil
	}
	if _, err := js.ResetConsumerToSequence(ctx, sinfo.Config.Name, cinfo.Name, sinfo.State.FirstSeq); err != nil {
		return err
	}
	log.Warn("jobs the old max_deliver had dropped are delivered again, from their first delivery; jobs in flight may be delivered a second time",
		"consumer", cinfo.Name, "dropped", sinfo.State.Msgs-live, "jobs", sinfo.State.Msgs)
	return nil
}
