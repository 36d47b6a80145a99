package queue

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/boxcar-run/boxcar/internal/config"
	"github.com/boxcar-run/boxcar/internal/job"
)

// CancelRequest is what a submitter writes to ask for a job to be cancelled. The worker records
// the outcome in the job's status, which only workers write.
type CancelRequest struct {
	At time.Time `json:"at"`
	// By is who asked, as the submitter claims it (user@host): a claim, not an identity.
	By string `json:"by,omitempty"`
}

// setUpCancel creates or updates the cancel bucket. A request is kept as long as a status: a
// worker that starts reads every request still there and ends the jobs they name.
func setUpCancel(ctx context.Context, js jetstream.JetStream, cfg config.NATS) error {
	_, err := declareBucket(ctx, js, jetstream.KeyValueConfig{
		Bucket:      CancelBucket,
		Description: "Boxcar: requests to cancel a job, by tenant.job",
		History:     1,
		TTL:         time.Duration(cfg.StatusTTL),
		Storage:     jetstream.FileStorage,
		Replicas:    cfg.Replicas,
	})
	if err != nil {
		return fmt.Errorf("queue: set up cancel bucket %s: %w", CancelBucket, err)
	}
	return nil
}

// Cancel asks for a job of the client's tenant to be cancelled and returns its status as it
// stands, with CancelRequested set: a worker ends a job that has not started as cancelled, and
// stops a running one. Asking twice is harmless. ErrFinal when the job already ended,
// ErrUnknownJob when neither the status bucket nor the job stream knows it.
func (c *Client) Cancel(ctx context.Context, id, by string) (job.Status, error) {
	st, err := c.Status(ctx, id)
	if err != nil {
		return job.Status{}, err
	}
	if st.State.Terminal() {
		return st, fmt.Errorf("%w: job %s is already %s", ErrFinal, id, st.State)
	}
	// An identity that may not cancel (an approver) is refused the bucket or the write.
	refusable := []string{"$JS.API.STREAM.INFO." + statusStream(CancelBucket), "$KV." + CancelBucket + "."}
	err = unlessRefused(ctx, c.js.Conn(), refusable, func(ctx context.Context) error {
		kv, err := bucket(ctx, c.js, CancelBucket, "cancel")
		if err != nil {
			return err
		}
		_, err = kv.Create(ctx, c.ref(id).key(), mustJSON(CancelRequest{At: time.Now().UTC(), By: by}))
		return err
	})
	if err != nil && !errors.Is(err, jetstream.ErrKeyExists) {
		return job.Status{}, fmt.Errorf("queue: cancel %s: %w", id, err)
	}
	st.CancelRequested = true
	return st, nil
}

// cancelRequested reports whether a cancel of the job was asked for. An identity the server
// does not let read the cancel bucket (an approver) sees none: the status says so once a
// worker acted on it.
func (c *Client) cancelRequested(ctx context.Context, r Ref) (bool, error) {
	var asked bool
	refusable := []string{"$JS.API.STREAM.INFO." + statusStream(CancelBucket), "$JS.API.DIRECT.GET." + statusStream(CancelBucket)}
	err := unlessRefused(ctx, c.js.Conn(), refusable, func(ctx context.Context) error {
		kv, err := bucket(ctx, c.js, CancelBucket, "cancel")
		if errors.Is(err, ErrNotReady) {
			return nil // a worker before the cancel bucket: nobody can have asked
		}
		if err != nil {
			return err
		}
		_, rev, err := read[CancelRequest](ctx, kv, r.key())
		asked = rev > 0
		return err
	})
	if errors.Is(err, ErrRefused) {
		return false, nil
	}
	return asked, err
}

// WatchCancels streams the jobs of the worker's tenants whose cancel was asked for: every
// request the bucket holds first, then the zero Ref to say those are all, then each new one,
// until ctx ends or the watch breaks (the channel closes; watch again, which reads them all
// again).
func (c *Consumer) WatchCancels(ctx context.Context) (<-chan Ref, error) {
	w, err := c.cancels.WatchAll(ctx, jetstream.IgnoreDeletes())
	if err != nil {
		return nil, fmt.Errorf("queue: watch the cancel bucket: %w", err)
	}
	out := make(chan Ref)
	go func() {
		defer close(out)
		defer func() { _ = w.Stop() }()
		for {
			select {
			case <-ctx.Done():
				return
			case e, ok := <-w.Updates():
				if !ok {
					return
				}
				var r Ref // nil: the requests there were are all delivered
				if e != nil {
					r = refOf(e.Key())
					if e.Operation() != jetstream.KeyValuePut || !slices.Contains(c.tenants, r.Tenant) || !job.ValidID(r.ID) {
						continue
					}
				}
				select {
				case out <- r:
				case <-ctx.Done():
					return
				}
			}
		}
	}()
	return out, nil
}
