package submitcmd

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io/fs"
	"syscall"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/boxcar-run/boxcar/internal/config"
	"github.com/boxcar-run/boxcar/internal/job"
	"github.com/boxcar-run/boxcar/internal/queue"
	"github.com/boxcar-run/boxcar/internal/store"
)

// defaultPatience is how long a command waits for NATS's JetStream or the store to answer
// (a leader election, a store restart) before it gives up; run waits up to its --timeout.
const defaultPatience = 30 * time.Second

// attemptWait bounds one lookup in NATS: a leader election answers none, so each attempt
// must end for the next to be tried.
const attemptWait = 5 * time.Second

// retryable reports whether err may pass by itself: not a thing that is really missing, not
// bad input, not the caller ending the command.
type retryable func(error) bool

// retry calls op until it succeeds, fails for good (!again) or the patience runs out. The
// first transient failure is said once on stderr, with what is waited for, and so is the
// recovery, with how long it took.
func (e *env) retry(ctx context.Context, what string, again retryable, op func(context.Context) error) error {
	deadline := time.Now().Add(e.patience)
	start := time.Now()
	backoff := 100 * time.Millisecond
	waited := false
	for {
		err := op(ctx)
		switch {
		case err == nil:
			if waited {
				fmt.Fprintf(e.stderr, "submit: %s answered after %s\n", what, time.Since(start).Round(100*time.Millisecond))
			}
			return nil
		case ctx.Err() != nil || !again(err):
			return err
		case time.Now().Add(backoff).After(deadline):
			return fmt.Errorf("gave up after %s waiting for %s: %w", time.Since(start).Round(time.Second), what, err)
		case !waited:
			waited = true
			printf(e.stderr, "submit: waiting for %s: %v (retrying with the same job id for up to %s)\n", what, err, e.patience)
		}
		select {
		case <-ctx.Done():
			return err
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, 2*time.Second)
	}
}

// transientNATS: everything but a stream or bucket that is really not there, or a refusal.
// In a JetStream cluster (clustered) "not there" may pass as well, for a while: the meta
// leader, which answers for a stream no server holds, knows (it calls itself leader only once
// it has applied its log), but a member of a stream's group that has just restarted may answer
// for the stream before it has loaded it (the faults' cluster run had a submission refused so
// as a node was killed). nats-server lets such a member answer in its group's first
// lostQuorumInterval (10 s) only, so "not there" is waited for up to missingWait from the
// first such answer, never the command's whole patience (run's is its --timeout, 30 minutes
// by default, which a tenant nobody set up waited out before it was told). A single server
// knows, and is believed at once.
func transientNATS(clustered bool) retryable {
	var missingSince time.Time
	return func(err error) bool {
		switch {
		case errors.Is(err, queue.ErrRefused):
			return false
		case !errors.Is(err, queue.ErrNotReady) && !errors.Is(err, queue.ErrNotServed):
			return true // no answer, a lost connection: an election, a restart
		case !clustered:
			return false
		case missingSince.IsZero():
			missingSince = time.Now()
		}
		return time.Since(missingSince) < missingWait
	}
}

// missingWait is how long a JetStream cluster may say a stream or bucket is missing before
// submit believes it: past the 10 s in which a restarted server may answer for a stream it has
// not loaded yet.
const missingWait = 15 * time.Second

// transientStore: everything but a refusal the store means (a bad key or URL, a 4xx other
// than a timeout or throttling, a file store's permission denied), a certificate the CAs
// given do not vouch for, and credentials that cannot be had unless a server's 5xx is why
// (STS down): no wait brings them, and run waited its whole --timeout for them.
func transientStore(err error) bool {
	var status interface{ HTTPStatusCode() int }
	var cert *tls.CertificateVerificationError
	switch {
	case errors.Is(err, store.ErrInvalidKey), errors.Is(err, store.ErrInvalidURL), errors.As(err, &cert):
		return false
	case errors.As(err, &status):
		code := status.HTTPStatusCode()
		return code >= 500 || code == 408 || code == 429 || code == 0
	case errors.Is(err, store.ErrCredentials):
		return false
	case errors.Is(err, fs.ErrPermission), errors.Is(err, syscall.EROFS):
		return false // a file store's folder the user may not write (a mode, an owner, mounted read-only)
	}
	return true
}

// bind finds the queue a worker set up, waiting out a JetStream that does not answer (a leader
// election, a restarting server).
func (e *env) bind(ctx context.Context, nc *nats.Conn, cfg config.NATS) (*queue.Client, error) {
	var q *queue.Client
	err := e.retry(ctx, "NATS JetStream at "+nc.ConnectedUrlRedacted(), transientNATS(nc.ConnectedClusterName() != ""), func(ctx context.Context) error {
		actx, cancel := context.WithTimeout(ctx, attemptWait)
		defer cancel()
		var err error
		q, err = queue.NewClient(actx, nc, cfg, e.tenant())
		return err
	})
	return q, err
}

// upload puts the inputs into the store, waiting out a store that does not answer; every
// attempt after the first sends only what the store does not have yet (content addressing).
func (e *env) upload(ctx context.Context, st store.Store, paths []string) (map[string]job.Input, error) {
	var inputs map[string]job.Input
	err := e.retry(ctx, "the store at "+st.URL(""), transientUpload, func(ctx context.Context) error {
		var err error
		inputs, err = uploadInputs(ctx, st, paths)
		return err
	})
	return inputs, err
}

// transientUpload: a store fault that may pass; never a local file that cannot be read.
func transientUpload(err error) bool {
	var local localInputError
	return !errors.As(err, &local) && transientStore(err)
}

// localInputError is an input file that cannot be read as it is: no wait changes that.
type localInputError struct{ error }

func (e localInputError) Unwrap() error { return e.error }
