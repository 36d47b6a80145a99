package queue

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/boxcar-run/boxcar/internal/config"
)

// Delivery is one delivery of a job message to this worker.
type Delivery struct {
	msg jetstream.Msg
	c   *Consumer

	// Tenant is the tenant whose subject the job came on.
	Tenant string
	// JobID is the job id its subject names (boxcar.jobs.T.J); empty for a subject of another
	// shape.
	JobID string
	// Data is the raw job message.
	Data []byte
	// Attempt counts deliveries of this message, starting at 1.
	Attempt int
	// Spared is how many of the deliveries before this one do not count against max_deliver:
	// the job's hand-backs to a peer (job.Status.HandedBack), which the worker sets once it read
	// them. LastAttempt and Exhausted count the other deliveries only.
	Spared int
	// Published is when the message entered the stream.
	Published time.Time
	// Seq is the message's sequence in the stream, what a publisher's ack reports.
	Seq uint64
	// consumer names the consumer that delivered it.
	consumer string
	// unanswered is set when a publish of this delivery's dead letter got no answer: it may
	// have landed (Term).
	unanswered bool
}

// AckWait is the ack deadline of the consumer that delivered the job, as the server had it
// when the worker last looked: with no heartbeat for that long, the server delivers the job
// again. `worker setup` may change it while the job runs, and the server applies the new one
// to the job at once.
func (d *Delivery) AckWait() time.Duration {
	if d.c == nil {
		return 0
	}
	return d.c.ackWaitOf(d.consumer)
}

// maxHeartbeat is the longest gap between two heartbeats of a running job, whatever its ack
// wait: `worker setup` may lower the consumer's ack wait while the job runs, down to
// config.MinAckWait, and the server then delivers again a job whose last heartbeat is older
// than that. A heartbeat paced by the ack wait the job began with (a third of 60s) would not
// come in time; one a second leaves two to spare at the shortest ack wait allowed.
const maxHeartbeat = config.MinAckWait / 3

// heartbeatEvery is the gap before the next heartbeat: a third of the consumer's ack wait as
// the worker knows it now, at most maxHeartbeat.
func (d *Delivery) heartbeatEvery() time.Duration {
	return max(min(d.AckWait()/3, maxHeartbeat), 50*time.Millisecond)
}

// Ref names the delivered job.
func (d *Delivery) Ref() Ref { return Ref{Tenant: d.Tenant, ID: d.JobID} }

// LastAttempt reports whether this is the last delivery that may run the job: the max_deliver'th
// or, when that one died, one of the deliveries after it.
func (d *Delivery) LastAttempt() bool { return d.Attempt-d.Spared >= d.c.cfg.MaxDeliver }

// Exhausted reports whether the job used up its max_deliver deliveries before this one: the
// last one ended without settling (its worker died, or stalled past AckWait). This delivery
// must not run the job but end it: with the committed run, or as dead. The server delivers
// such a message again until a worker settles it, so the end does not hang on any one worker.
func (d *Delivery) Exhausted() bool { return d.Attempt-d.Spared > d.c.cfg.MaxDeliver }

// Ack marks the job done and waits for the server to confirm, so a crash right after cannot
// bring it back.
func (d *Delivery) Ack(ctx context.Context) error {
	if err := d.msg.DoubleAck(ctx); err != nil {
		return fmt.Errorf("queue: ack job %s: %w", d.JobID, err)
	}
	return nil
}

// Nak hands the job back for redelivery after delay (zero: at once). It waits until the
// server has the nak, so a worker that stops right after does not leave the job to AckWait.
func (d *Delivery) Nak(ctx context.Context, delay time.Duration) error {
	var err error
	if delay > 0 {
		err = d.msg.NakWithDelay(delay)
	} else {
		err = d.msg.Nak()
	}
	if err == nil {
		flushCtx, cancel := context.WithTimeout(ctx, 5*time.Second)
		err = d.c.js.Conn().FlushWithContext(flushCtx)
		cancel()
	}
	if err != nil {
		return fmt.Errorf("queue: nak job %s: %w", d.JobID, err)
	}
	return nil
}

// DeadLetter is what the dead-letter stream keeps about a job that can never run.
type DeadLetter struct {
	Tenant   string    `json:"tenant,omitempty"`
	JobID    string    `json:"job_id"`
	Reason   string    `json:"reason"`
	Error    string    `json:"error"`
	Attempt  int       `json:"attempt"`
	At       time.Time `json:"at"`
	Original []byte    `json:"original"` // the job message as delivered
}

// Term stops all further deliveries and keeps the message, with the reason, in the dead-letter
// stream. The dead letter is written first: a job is never dropped without a trace. A job has
// at most one dead letter: it is published only if its subject holds none (the server checks,
// so two deliveries ending the job at once cannot both write one), and a delivery that finds
// one already (its worker died between the dead letter and the term, or another delivery
// ended the job) only terminates the message. lettered reports whether this delivery wrote the
// job's dead letter, also when the term after it failed: what counts dead letters counts it
// then, and not at a later delivery that finds it. A letter found after an earlier call's
// publish got no answer (NATS went away) is read back: one of this delivery's attempt landed
// then, and counts as written now; before, no delivery counted such a letter. A letter it
// cannot read back yet fails the Term, and the next try reads it (wroteLetter).
func (d *Delivery) Term(ctx context.Context, reason string, cause error) (lettered bool, err error) {
	dl := DeadLetter{Tenant: d.Tenant, JobID: d.JobID, Reason: reason, Attempt: d.Attempt, At: time.Now().UTC(), Original: d.Data}
	if cause != nil {
		dl.Error = cause.Error()
	}
	data, err := json.Marshal(dl)
	if err != nil {
		return false, fmt.Errorf("queue: encode dead letter: %w", err)
	}
	_, served := slices.BinarySearch(d.c.tenants, d.Tenant)
	box, err := d.c.letters().publishLetter(ctx, letterRef(Ref{Tenant: d.Tenant, ID: d.JobID}, d.Seq), data, served)
	var api *jetstream.APIError
	if err != nil && !errors.Is(err, errLettered) && !errors.Is(err, errUnanswered) && !errors.Is(err, ErrRefused) && !errors.As(err, &api) {
		d.unanswered = true // no answer to the publish: the letter may be in the stream (errUnanswered, ErrRefused: nothing was published)
	}
	if err != nil && !isWrongLastSequence(err) && !errors.Is(err, errLettered) {
		return false, fmt.Errorf("queue: dead-letter job %s: %w", d.JobID, err)
	}
	lettered = err == nil
	if !lettered && d.unanswered {
		if lettered, err = d.wroteLetter(ctx, box); err != nil {
			return false, fmt.Errorf("queue: dead-letter job %s: %w", d.JobID, err)
		}
	}
	if err := d.msg.TermWithReason(reason); err != nil {
		return lettered, fmt.Errorf("queue: terminate job %s: %w", d.JobID, err)
	}
	return lettered, nil
}

// wroteLetter reports whether the letter in box is this delivery's: an earlier try of Term
// wrote it, and got no answer. A stream that is there and answers no read (its leader being
// elected) is an error (sharedStream.lookup), and the Term fails, terminating nothing: taken as
// no letter of this delivery's, the job ended with its letter written and counted by none. The
// settle tries the Term again, and the runner says it waits for NATS. A letter that is gone
// (its stream removed) or of another shape is not known to be this delivery's: false.
func (d *Delivery) wroteLetter(ctx context.Context, box letterBox) (bool, error) {
	msg, err := (&sharedStream{nc: d.c.js.Conn(), name: box.stream}).lookup(ctx, d.c.js, box.subject)
	if err != nil {
		return false, fmt.Errorf("read the job's dead letter back, to tell whether this delivery wrote it: %w", err)
	}
	var dl DeadLetter
	if msg == nil || json.Unmarshal(msg.Data, &dl) != nil {
		d.c.log.WarnContext(ctx, "the job's dead letter is not one to read back, to tell whether this delivery wrote it; it is not counted", "job_id", d.JobID, "tenant", d.Tenant, "stream", box.stream)
		return false, nil
	}
	return dl.Tenant == d.Tenant && dl.JobID == d.JobID && dl.Attempt == d.Attempt, nil
}

// KeepAlive tells the server the job is still being worked on, every interval (zero: a third
// of the consumer's AckWait as it is at each heartbeat, at most a second apart: see
// maxHeartbeat), until the returned stop function is called. Long model calls and tools never
// cause a redelivery, nor does `worker setup` lowering the ack wait while the job runs.
func (d *Delivery) KeepAlive(ctx context.Context, interval time.Duration) (stop func()) {
	ctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Go(func() { d.Heartbeat(ctx, interval) })
	return func() { cancel(); wg.Wait() }
}

// Heartbeat is KeepAlive's loop on the caller's goroutine: it returns when ctx ends. A caller
// that runs it on a goroutine of its own decides what a panic in it ends (the runner's: the
// job's attempt, not the worker).
func (d *Delivery) Heartbeat(ctx context.Context, interval time.Duration) {
	every := func() time.Duration { return max(interval, 50*time.Millisecond) }
	if interval <= 0 {
		every = d.heartbeatEvery
	}
	t := time.NewTimer(every())
	defer t.Stop()
	failing := false // logged once per outage, not at every beat
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			t.Reset(every())
			err := d.msg.InProgress()
			switch {
			case err != nil && !failing:
				failing = true
				d.c.log.WarnContext(ctx, "in-progress heartbeat failed; still trying", "job_id", d.JobID, "tenant", d.Tenant, "error", err)
			case err != nil:
				d.c.log.DebugContext(ctx, "in-progress heartbeat failed again", "job_id", d.JobID, "tenant", d.Tenant, "error", err)
			case failing:
				failing = false
				d.c.log.InfoContext(ctx, "in-progress heartbeats go through again", "job_id", d.JobID, "tenant", d.Tenant)
			}
		}
	}
}

// isWrongLastSequence reports the server's refusal of a publish whose subject already holds a
// message though the publish expected none.
func isWrongLastSequence(err error) bool {
	var api *jetstream.APIError
	return errors.As(err, &api) && (api.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequence || api.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequenceConstant)
}
