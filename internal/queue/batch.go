package queue

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/boxcar-run/boxcar/internal/job"
)

// PendingPublish is a job published without waiting for the server; Wait gives the outcome.
type PendingPublish struct {
	id      string
	subject string
	stream  string
	limits  []streamLimit // the job stream's, named by the settings that set them
	nc      *nats.Conn
	ack     jetstream.PubAckFuture
}

// PublishAsync sends a job without waiting for the server's ack, so a client that submits many
// jobs keeps the connection full instead of paying a round trip per job. The semantics are
// Publish's. The caller bounds how many it leaves pending and calls Wait on each.
func (c *Client) PublishAsync(j job.Job) (*PendingPublish, error) {
	j.Tenant = c.tenant // what the subject says; the worker reads it from there
	data, err := j.Encode()
	if err != nil {
		return nil, err
	}
	r := c.ref(j.ID)
	if err := c.served(); err != nil {
		return nil, fmt.Errorf("queue: publish job %s: %w", j.ID, err)
	}
	// No Nats-Msg-Id: the server would drop a job whose header another tenant set first
	// (it checks the header against nothing). The subject names the job, and the stream
	// holds one message per subject.
	stream := jobStream(c.cfg, c.tenant)
	f, err := c.js.PublishMsgAsync(&nats.Msg{Subject: jobSubject(c.cfg, r), Data: data}, jetstream.WithExpectStream(stream))
	if err != nil {
		return nil, fmt.Errorf("queue: publish job %s: %w", j.ID, err)
	}
	limits := jobStreamLimits(streamBoundSettings(c.tenant, c.jobs))
	return &PendingPublish{id: j.ID, subject: jobSubject(c.cfg, r), stream: stream, limits: limits, nc: c.js.Conn(), ack: f}, nil
}

// Wait returns the outcome of the publish: duplicate when the job stream already holds the
// job (queued, or running). ErrRefused when the server does not let this login publish there
// (another tenant's subject, or an identity that may not submit).
func (p *PendingPublish) Wait(ctx context.Context) (duplicate bool, err error) {
	err = unlessRefused(ctx, p.nc, []string{p.subject}, func(ctx context.Context) error {
		select {
		case ack := <-p.ack.Ok():
			duplicate = ack.Duplicate
			return nil
		case err := <-p.ack.Err():
			if subjectFull(err) {
				duplicate = true
				return nil
			}
			return atLimit(err, p.stream, p.limits)
		case <-ctx.Done():
			return ctx.Err()
		}
	})
	if err != nil {
		return false, fmt.Errorf("queue: publish job %s: %w", p.id, err)
	}
	return duplicate, nil
}

// WatchStatuses streams the status of every job in ids: each one's current value first, then
// each change seen, until ctx ends or each of them reached a terminal state or stayed unknown
// for UnknownGrace (as WatchStatus says). It reads them in
// rounds of direct gets, readConcurrency at a time, pollEvery apart, as WatchStatus does.
func (c *Client) WatchStatuses(ctx context.Context, ids []string) (<-chan job.Status, error) {
	out := make(chan job.Status)
	go c.pollStatuses(ctx, ids, out)
	return out, nil
}

// subjectFull reports the job stream refusing a message because its subject holds one
// already: the job is queued or running. The server says so only in the description of a
// generic "store failed" error (10077, also a full stream's), so that is what is matched.
func subjectFull(err error) bool {
	var api *jetstream.APIError
	return errors.As(err, &api) && api.ErrorCode == jsStoreFailed && strings.Contains(api.Description, "maximum messages per subject exceeded")
}

// jsStoreFailed is the JetStream error code of a message the stream did not store.
const jsStoreFailed jetstream.ErrorCode = 10077

// served is ErrNotServed when the tenant's job stream takes no jobs of it: setup retired the
// tenant while jobs of it ran. An identity that may not read the stream is not checked here; the
// server then finds no stream for the job.
func (c *Client) served() error {
	if c.jobs == nil {
		return nil
	}
	subjects := c.jobs.CachedInfo().Config.Subjects
	if slices.Contains(subjects, tenantFilter(c.cfg, c.tenant)) {
		return nil
	}
	return fmt.Errorf("%w %q: `worker setup` retired the tenant, and its job stream %s takes no new job; submit as another tenant (--tenant), or ask the operator to add %q to tenants: in the worker config and run `worker setup`",
		ErrNotServed, c.tenant, c.jobs.CachedInfo().Config.Name, c.tenant)
}
