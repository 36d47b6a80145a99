package queue

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// ConsumerLag reports, from the server's view of the workers' durable consumer, how many jobs
// wait to be delivered (pending) and how many are delivered but not yet acknowledged
// (ackPending). Both are cluster-wide: every worker sees the same numbers.
func (q *Queue) ConsumerLag(ctx context.Context) (pending, ackPending uint64, err error) {
	if q.cons == nil {
		return 0, 0, errors.New("queue: consumer lag on a client handle; use queue.New")
	}
	info, err := q.cons.Info(ctx)
	if err != nil {
		return 0, 0, fmt.Errorf("queue: look up consumer %s: %w", q.cfg.Consumer, err)
	}
	return info.NumPending, uint64(max(info.NumAckPending, 0)), nil
}

// ConsumerAckWait is the ack deadline of the workers' durable consumer as the server has it. A
// client handle's own configuration holds only the defaults, which a worker's config may have
// changed.
func (q *Queue) ConsumerAckWait(ctx context.Context) (time.Duration, error) {
	cons, err := q.js.Consumer(ctx, q.cfg.Stream, q.cfg.Consumer)
	if err != nil {
		return 0, fmt.Errorf("queue: look up consumer %s: %w", q.cfg.Consumer, err)
	}
	return cons.CachedInfo().Config.AckWait, nil
}
