// Package queue owns Boxcar's use of NATS JetStream: the job stream and its durable pull
// consumers, publishing, fetching with ack/nak/term and in-progress heartbeats, the dead-letter
// stream, and the status, approvals and profiles buckets. It knows nothing about sandboxes,
// models or storage.
//
// It is split by role, as NATS permissions split them: an Admin declares the streams, buckets
// and consumers (`worker setup`, or a worker with operator rights at start); a Consumer is what
// a worker uses (fetch and settle jobs, write statuses, ask for approvals, advertise profiles);
// a Client is what `submit` uses (publish, read and watch statuses, cancel, answer approvals).
package queue

import (
	"context"
	"errors"
	"fmt"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/boxcar-run/boxcar/internal/config"
)

// statusHistory is how many revisions of a job's status the bucket keeps.
const statusHistory = 16

// Ref names one job as the worker knows it: the tenant it came from and its id.
type Ref struct {
	Tenant string
	ID     string
}

// key is the job's key in the status bucket.
func (r Ref) key() string { return r.ID }

func (r Ref) String() string { return r.key() }

// newJetStream is the JetStream context of every handle.
func newJetStream(nc *nats.Conn) (jetstream.JetStream, error) {
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, fmt.Errorf("queue: jetstream: %w", err)
	}
	return js, nil
}

// bucket looks up a bucket the operator declared; ErrNotReady when it is missing.
func bucket(ctx context.Context, js jetstream.JetStream, name, what string) (jetstream.KeyValue, error) {
	kv, err := js.KeyValue(ctx, name)
	if errors.Is(err, jetstream.ErrBucketNotFound) {
		return nil, fmt.Errorf("%w: %s bucket %s does not exist on %s; %s", ErrNotReady, what, name, js.Conn().ConnectedUrlRedacted(), setupHint)
	}
	if err != nil {
		// A timeout is no proof the bucket is missing: a leader election answers nothing.
		return nil, fmt.Errorf("queue: look up %s bucket %s: %w", what, name, err)
	}
	return kv, nil
}

// setupHint says how to declare what a handle found missing.
const setupHint = "start a worker first (`worker --embedded`), or run `worker setup` with an operator identity"

func dlqSubject(cfg config.NATS, jobID string) string {
	return cfg.DeadLetterStream + "." + jobID
}
