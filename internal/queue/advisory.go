package queue

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/boxcar-run/boxcar/internal/job"
)

// maxDeliveriesAdvisory is what the server publishes when a message used up MaxDeliver
// deliveries without an ack, e.g. because its last worker died.
type maxDeliveriesAdvisory struct {
	Stream     string `json:"stream"`
	Consumer   string `json:"consumer"`
	StreamSeq  uint64 `json:"stream_seq"`
	Deliveries int    `json:"deliveries"`
}

// HandleMaxDeliveries turns the server's max-deliveries advisories into dead letters until ctx
// ends: the job's payload (still in the stream, since it was never acked) and its last error
// go to the dead-letter stream, its status becomes dead, and the message leaves the job stream.
// Workers share the subscription as a queue group, so each advisory is handled once.
// onDead, if not nil, is called for each job dead-lettered.
func (q *Queue) HandleMaxDeliveries(ctx context.Context, nc *nats.Conn, onDead func(DeadLetter)) error {
	subject := fmt.Sprintf("$JS.EVENT.ADVISORY.CONSUMER.MAX_DELIVERIES.%s.%s", q.cfg.Stream, q.cfg.Consumer)
	msgs := make(chan *nats.Msg, 64)
	sub, err := nc.ChanQueueSubscribe(subject, "boxcar-advisories", msgs)
	if err != nil {
		return fmt.Errorf("queue: subscribe to max-deliveries advisories: %w", err)
	}
	defer sub.Unsubscribe() //nolint:errcheck // best effort on shutdown
	for {
		select {
		case <-ctx.Done():
			return nil
		case m := <-msgs:
			dl, err := q.deadLetterExhausted(ctx, m.Data)
			if err != nil {
				q.log.ErrorContext(ctx, "dead-letter a job that exhausted its deliveries", "error", err)
				continue
			}
			if onDead != nil {
				onDead(dl)
			}
		}
	}
}

func (q *Queue) deadLetterExhausted(ctx context.Context, data []byte) (DeadLetter, error) {
	var adv maxDeliveriesAdvisory
	if err := json.Unmarshal(data, &adv); err != nil {
		return DeadLetter{}, fmt.Errorf("decode advisory: %w", err)
	}
	stream, err := q.js.Stream(ctx, q.cfg.Stream)
	if err != nil {
		return DeadLetter{}, err
	}
	raw, err := stream.GetMsg(ctx, adv.StreamSeq)
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return DeadLetter{}, fmt.Errorf("message %d is gone: a worker settled it meanwhile", adv.StreamSeq)
	}
	if err != nil {
		return DeadLetter{}, fmt.Errorf("get message %d: %w", adv.StreamSeq, err)
	}
	dl := DeadLetter{JobID: raw.Header.Get(jetstream.MsgIDHeader), Reason: "max_deliveries", Attempt: adv.Deliveries, At: time.Now().UTC(), Original: raw.Data}
	if st, err := q.Status(ctx, dl.JobID); err == nil {
		dl.Error = st.Error
	}
	if dl.Error == "" {
		dl.Error = fmt.Sprintf("no worker finished the job in %d deliveries", adv.Deliveries)
	}
	payload, err := json.Marshal(dl)
	if err != nil {
		return DeadLetter{}, err
	}
	if _, err := q.js.Publish(ctx, dlqSubject(q.cfg, sanitizeToken(orUnknown(dl.JobID))), payload); err != nil {
		return DeadLetter{}, fmt.Errorf("publish dead letter: %w", err)
	}
	if job.ValidID(dl.JobID) {
		_, err := q.UpdateStatus(ctx, dl.JobID, func(s *job.Status) {
			s.State, s.Attempt, s.Progress, s.FinishedAt = job.StateDead, adv.Deliveries, "", time.Now().UTC()
			s.Error = "gave up after " + fmt.Sprint(adv.Deliveries) + " deliveries: " + dl.Error
		})
		if err != nil && !errors.Is(err, ErrFinal) {
			return dl, fmt.Errorf("record job %s as dead: %w", dl.JobID, err)
		}
	}
	if err := stream.DeleteMsg(ctx, adv.StreamSeq); err != nil && !errors.Is(err, jetstream.ErrMsgNotFound) {
		return dl, fmt.Errorf("remove message %d from %s: %w", adv.StreamSeq, q.cfg.Stream, err)
	}
	return dl, nil
}

func orUnknown(id string) string {
	if id == "" {
		return "unknown"
	}
	return id
}
