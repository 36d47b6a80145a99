package submitcmd

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/boxcar-run/boxcar/internal/job"
	"github.com/boxcar-run/boxcar/internal/queue"
)

// exitUnknown is the exit code of run when the server never confirmed the submission: the job
// may or may not be queued. Its id is printed, so a script can look (`submit status ID`) or
// submit again with `--id ID`, which runs it once whether or not the first one arrived.
const exitUnknown = 9

// publishPolicy bounds the retries of one publish. Every retry goes to the same job subject,
// of which the job stream holds one message: a retry after a lost ack, while the first is
// queued or running, is refused as a duplicate; once it ran, the worker finds its committed run
// or final status and runs nothing. A retry never runs a job twice.
type publishPolicy struct {
	attempt time.Duration // how long one attempt waits for its ack
	budget  time.Duration // how long all attempts may take
}

var defaultPublishPolicy = publishPolicy{attempt: 5 * time.Second, budget: time.Minute}

// errUnknownOutcome marks a publish whose result the server never confirmed.
var errUnknownOutcome = errors.New("the server did not confirm the submission")

// publisher is the one queue method publishing needs.
type publisher interface {
	Publish(ctx context.Context, j job.Job) (duplicate bool, err error)
}

// publish sends j, retrying with the same message id until the server confirms or the budget
// runs out. retried reports whether the confirmation came on a retry, in which case the
// server's "duplicate" may be this command's own first attempt. An error wraps
// errUnknownOutcome when some attempt may have stored the job.
func (p publishPolicy) publish(ctx context.Context, q publisher, j job.Job) (duplicate, retried bool, err error) {
	ctx, cancel := context.WithTimeout(ctx, p.budget)
	defer cancel()
	var (
		ambiguous bool
		lastErr   error
	)
	backoff := 100 * time.Millisecond
	for attempt := 1; ; attempt++ {
		actx, acancel := context.WithTimeout(ctx, p.attempt)
		dup, err := q.Publish(actx, j)
		acancel()
		if err == nil {
			return dup, attempt > 1, nil
		}
		lastErr = err
		switch {
		case permanent(err):
			return false, attempt > 1, err
		case !notSent(err):
			ambiguous = true
		}
		select {
		case <-ctx.Done():
			if ambiguous {
				return false, true, fmt.Errorf("%w after %d attempts: %w", errUnknownOutcome, attempt, lastErr)
			}
			return false, true, fmt.Errorf("%w; the job was not submitted (%d attempts)", lastErr, attempt)
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, 2*time.Second)
	}
}

// permanent reports errors no retry can change: an invalid job, or the server refusing it
// (other than "temporarily unavailable"). A full job stream is said at once, naming its limit
// (queue.ErrFull), rather than retried for a minute: room comes as jobs end, which can take
// longer, and the submitter decides whether to wait.
func permanent(err error) bool {
	var api *jetstream.APIError
	switch {
	case errors.Is(err, job.ErrInvalid), errors.Is(err, queue.ErrNotReady), errors.Is(err, queue.ErrRefused), errors.Is(err, queue.ErrNotServed),
		errors.Is(err, queue.ErrFull):
		return true
	case errors.As(err, &api):
		return api.Code != 503
	}
	return false
}

// notSent reports errors that prove the job did not reach a stream: nobody answered the
// publish at all.
func notSent(err error) bool {
	return errors.Is(err, jetstream.ErrNoStreamResponse)
}
