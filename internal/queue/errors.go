package queue

import (
	"errors"
	"fmt"
	"time"
)

var (
	// ErrNotReady marks a client that found no stream or bucket: no worker has set them up.
	ErrNotReady = errors.New("queue not set up")
	// ErrNotServed marks a job of a tenant the workers do not serve: the job stream takes no
	// jobs on its subjects.
	ErrNotServed = errors.New("no worker serves tenant")
	// ErrUnknownJob marks a job id the status bucket does not know.
	ErrUnknownJob = errors.New("unknown job")
	// ErrFinal marks a status change refused because the job already ended.
	ErrFinal = errors.New("job already ended")
	// ErrSuperseded marks a status change of one delivery of a job refused because a later
	// delivery wrote the status (ByAttempt): the job is that delivery's now.
	ErrSuperseded = errors.New("a later delivery of the job holds its status")
	// ErrStatusExists marks a status change refused because the status exists (OnlyNew).
	ErrStatusExists = errors.New("a status exists under that id")
	// ErrUnknownApproval marks a job and call id with no approval request.
	ErrUnknownApproval = errors.New("no such approval request")
	// ErrAlreadyDecided marks an answer to an approval request that was already answered.
	ErrAlreadyDecided = errors.New("approval request already answered")
	// ErrApprovalExpired marks an answer that came after the request's approval timeout: the
	// command was denied for want of an answer.
	ErrApprovalExpired = errors.New("approval request expired")
	// ErrMisfiledApproval marks an entry of the approvals bucket whose body names another
	// request than its key: no worker wrote it so, and it is neither shown nor answered.
	ErrMisfiledApproval = errors.New("approval entry names another request than its key")
	// ErrApprovalChanged marks an answer bound to a revision of the request (the one a person
	// was shown) when the key now holds another.
	ErrApprovalChanged = errors.New("approval request changed since it was shown")
)

// PermanentError wraps a fault that retrying cannot fix: the job is terminated and
// dead-lettered.
type PermanentError struct {
	Reason string // a short machine-readable reason, e.g. "invalid_job", "unknown_profile"
	Err    error
}

func (e *PermanentError) Error() string { return e.Err.Error() }
func (e *PermanentError) Unwrap() error { return e.Err }

// Permanent marks err as not worth retrying, with a short reason for the dead letter.
func Permanent(reason string, err error) error { return &PermanentError{Reason: reason, Err: err} }

// RetryAfterError asks for a redelivery no sooner than Delay.
type RetryAfterError struct {
	Delay time.Duration
	Err   error
}

func (e *RetryAfterError) Error() string {
	return fmt.Sprintf("%v (retry in %s)", e.Err, e.Delay)
}
func (e *RetryAfterError) Unwrap() error { return e.Err }

// RetryAfter asks for the job to be delivered again no sooner than d (the runner waits its
// backoff when that is longer).
func RetryAfter(d time.Duration, err error) error { return &RetryAfterError{Delay: d, Err: err} }
