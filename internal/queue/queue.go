// Package queue owns Boxcar's use of NATS JetStream: the job stream and its durable pull
// consumer, publishing, fetching with ack/nak/term and in-progress heartbeats, the dead-letter
// stream, and the job status bucket. It knows nothing about sandboxes, models or storage.
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

// Queue is a handle on the job stream, its consumer and the status bucket.
type Queue struct {
	js     jetstream.JetStream
	cfg    config.NATS
	cons   jetstream.Consumer // nil for clients that only publish and read status
	status jetstream.KeyValue
	// approvals is set by New; client handles look the bucket up when they use it (approvals.go).
	approvals jetstream.KeyValue
	log       *slog.Logger
	written   statusCache // the statuses this handle wrote last (status.go)
}

// statusHistory is how many revisions of a job's status the bucket keeps.
const statusHistory = 16

// New sets up (or updates) everything a worker needs: the job stream, the dead-letter stream,
// the durable consumer and the status bucket. It is safe to call from every worker at start.
func New(ctx context.Context, nc *nats.Conn, cfg config.NATS, log *slog.Logger) (*Queue, error) {
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, fmt.Errorf("queue: jetstream: %w", err)
	}
	q := &Queue{js: js, cfg: cfg, log: log}
	if q.cons, q.status, q.approvals, err = declare(ctx, js, cfg, log); err != nil {
		return nil, err
	}
	return q, nil
}

// declare creates or updates the streams, the consumer and the buckets.
func declare(ctx context.Context, js jetstream.JetStream, cfg config.NATS, log *slog.Logger) (cons jetstream.Consumer, status, approvals jetstream.KeyValue, err error) {
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
	stream, err := ensureStream(ctx, js, jobs, jobsBefore, log)
	if err != nil {
		return nil, nil, nil, fmt.Errorf("queue: set up stream %s: %w (if the stream exists with incompatible settings, remove it with `nats stream rm %s` after draining it)", cfg.Stream, err, cfg.Stream)
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
	if _, err := ensureStream(ctx, js, dead, deadBefore, log); err != nil {
		return nil, nil, nil, fmt.Errorf("queue: set up dead-letter stream %s: %w", cfg.DeadLetterStream, err)
	}
	var before *jetstream.ConsumerConfig
	if c, err := stream.Consumer(ctx, cfg.Consumer); err == nil {
		before = &c.CachedInfo().Config
	} else if !errors.Is(err, jetstream.ErrConsumerNotFound) {
		return nil, nil, nil, fmt.Errorf("queue: look up consumer %s: %w", cfg.Consumer, err)
	}
	cons, err = stream.CreateOrUpdateConsumer(ctx, jetstream.ConsumerConfig{
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
		return nil, nil, nil, fmt.Errorf("queue: set up consumer %s: %w (if it cannot be updated, remove it with `nats consumer rm %s %s` while no worker runs; jobs stay in the stream)", cfg.Consumer, err, cfg.Stream, cfg.Consumer)
	}
	if before != nil && before.MaxDeliver > 0 {
		if err := redeliverDropped(ctx, js, stream, cons, before.MaxDeliver, log); err != nil {
			return nil, nil, nil, fmt.Errorf("queue: consumer %s: deliver again the jobs its old max_deliver of %d dropped: %w", cfg.Consumer, before.MaxDeliver, err)
		}
	}
	if status, err = setUpStatus(ctx, js, cfg, log); err != nil {
		return nil, nil, nil, fmt.Errorf("queue: set up status bucket %s: %w", cfg.StatusBucket, err)
	}
	if approvals, err = setUpApprovals(ctx, js, cfg); err != nil {
		return nil, nil, nil, err
	}
	return cons, status, approvals, nil
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

// Bind looks up what a worker set up, for clients that publish jobs and read status. It creates
// nothing, so a client never races a worker's settings.
func Bind(ctx context.Context, nc *nats.Conn, cfg config.NATS) (*Queue, error) {
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, fmt.Errorf("queue: jetstream: %w", err)
	}
	if _, err := js.Stream(ctx, cfg.Stream); err != nil {
		if errors.Is(err, jetstream.ErrStreamNotFound) {
			return nil, fmt.Errorf("%w: stream %s does not exist on %s; start a worker first (`worker --embedded`)", ErrNotReady, cfg.Stream, nc.ConnectedUrlRedacted())
		}
		return nil, fmt.Errorf("queue: look up stream %s: %w", cfg.Stream, err)
	}
	kv, err := js.KeyValue(ctx, cfg.StatusBucket)
	if errors.Is(err, jetstream.ErrBucketNotFound) {
		return nil, fmt.Errorf("%w: status bucket %s does not exist on %s; start a worker first (`worker --embedded`)", ErrNotReady, cfg.StatusBucket, nc.ConnectedUrlRedacted())
	}
	if err != nil {
		// A timeout is no proof the bucket is missing: a leader election answers nothing.
		return nil, fmt.Errorf("queue: look up status bucket %s: %w", cfg.StatusBucket, err)
	}
	return &Queue{js: js, cfg: cfg, status: kv, log: slog.New(slog.DiscardHandler)}, nil
}

// Publish sends a job. The job id is the message id, so a second publish of the same id inside
// the duplicate window is dropped by the server; duplicate reports that case.
func (q *Queue) Publish(ctx context.Context, j job.Job) (duplicate bool, err error) {
	data, err := j.Encode()
	if err != nil {
		return false, err
	}
	now := time.Now().UTC()
	rev, err := q.status.Create(ctx, j.ID, mustJSON(job.Status{ID: j.ID, State: job.StateQueued, Profile: j.Profile, Labels: j.Labels, QueuedAt: now, UpdatedAt: now}))
	if err != nil && !errors.Is(err, jetstream.ErrKeyExists) {
		return false, fmt.Errorf("queue: record job %s as queued: %w", j.ID, err)
	}
	ack, err := q.js.Publish(ctx, q.cfg.Subject, data, jetstream.WithMsgID(j.ID), jetstream.WithExpectStream(q.cfg.Stream))
	if err != nil {
		var refused *jetstream.APIError
		if rev > 0 && errors.As(err, &refused) {
			// The stream refused the job (full: job_max_msgs or job_max_bytes): it was never
			// queued, so neither is its status.
			_ = q.status.Delete(ctx, j.ID, jetstream.LastRevision(rev))
		}
		return false, fmt.Errorf("queue: publish job %s: %w", j.ID, err)
	}
	return ack.Duplicate, nil
}

// Fetch waits for the next job and returns its delivery. It returns only when a message
// arrives or ctx ends, so callers fetch only when they have a free slot.
func (q *Queue) Fetch(ctx context.Context) (*Delivery, error) {
	if q.cons == nil {
		return nil, errors.New("queue: fetch on a client handle; use queue.New")
	}
	failing := false // a failure was logged: say once when fetching works again
	for {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		// Short pulls keep the request alive across server restarts and leader changes.
		pullCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
		msg, err := q.cons.Next(jetstream.FetchContext(pullCtx))
		cancel()
		if failing && (err == nil || isPullTimeout(err)) {
			failing = false
			q.log.InfoContext(ctx, "fetching jobs again")
		}
		switch {
		case err == nil:
			return q.delivery(msg)
		case ctx.Err() != nil:
			return nil, ctx.Err()
		case isPullTimeout(err):
			q.redeclareIfGone(ctx)
			continue
		default:
			q.redeclareIfGone(ctx)
			// Once per outage, not once a second: the connection's own log says more.
			if !failing {
				failing = true
				q.log.WarnContext(ctx, "fetch failed; retrying every second", "error", err)
			} else {
				q.log.DebugContext(ctx, "fetch failed again", "error", err)
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
// they are found by name.
func (q *Queue) redeclareIfGone(ctx context.Context) {
	_, err := q.js.Consumer(ctx, q.cfg.Stream, q.cfg.Consumer)
	if !errors.Is(err, jetstream.ErrStreamNotFound) && !errors.Is(err, jetstream.ErrConsumerNotFound) {
		return
	}
	q.log.WarnContext(ctx, "the job stream or its consumer is gone from NATS; setting them up again", "stream", q.cfg.Stream, "consumer", q.cfg.Consumer, "error", err)
	if _, _, _, err := declare(ctx, q.js, q.cfg, q.log); err != nil {
		q.log.ErrorContext(ctx, "set up the job stream again failed; trying at the next fetch", "error", err)
		return
	}
	q.log.InfoContext(ctx, "job stream and consumer set up again")
}

// isPullTimeout reports a pull that ended with nothing to deliver, which is no failure.
func isPullTimeout(err error) bool {
	return errors.Is(err, nats.ErrTimeout) || errors.Is(err, context.DeadlineExceeded) || errors.Is(err, jetstream.ErrNoHeartbeat)
}

func (q *Queue) delivery(msg jetstream.Msg) (*Delivery, error) {
	meta, err := msg.Metadata()
	if err != nil {
		return nil, fmt.Errorf("queue: message metadata: %w", err)
	}
	return &Delivery{
		msg:       msg,
		q:         q,
		JobID:     msg.Headers().Get(jetstream.MsgIDHeader),
		Data:      msg.Data(),
		Attempt:   int(meta.NumDelivered),
		Published: meta.Timestamp,
		Seq:       meta.Sequence.Stream,
	}, nil
}

// AckWait is the consumer's ack deadline; heartbeats keep a running job inside it.
func (q *Queue) AckWait() time.Duration { return time.Duration(q.cfg.AckWait) }

func dlqSubject(cfg config.NATS, jobID string) string {
	return cfg.DeadLetterStream + "." + jobID
}
