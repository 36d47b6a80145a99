package queue

import (
	"context"
	"errors"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/boxcar-run/boxcar/internal/job"
)

// pollEvery is how long a watch waits between two rounds of reading the statuses it follows.
// A client watches by direct gets, not with a consumer (read.go), so it sees a job's status
// as it is at each round: a revision written and replaced between two rounds is not seen. The
// terminal one always is: it is never replaced.
const pollEvery = 250 * time.Millisecond

// UnknownGrace is how long a watched job may stay unknown (no status, and not in the job stream)
// before the watch ends for it: long enough for a job being published as the watch starts, or a
// status read from a replica a moment behind; short enough that a job never submitted, or
// submitted as another tenant, is said unknown instead of watched until the timeout.
const UnknownGrace = 5 * time.Second

// poller follows the statuses of some jobs of a client's tenant by direct gets, sending each
// job's status when its revision changes, until every one is terminal.
type poller struct {
	c    *Client
	out  chan<- job.Status
	open []string          // the jobs not terminal yet, in the order given
	sent map[string]uint64 // the revision of each job's status last sent
	// queued are the jobs found in the job stream without a status: a job no worker has taken
	// yet is said queued, once, as its first status, and not looked up again.
	queued map[string]bool
	// unknownSince is when each job was first found unknown: no status, not in the job stream.
	unknownSince map[string]time.Time
}

// pollStatuses sends, for each job of ids, its current status first (queued for one in the
// job stream with no status yet), then each change a round sees, until ctx ends or every job
// reached a terminal state (the last value sent for it) or stayed unknown for UnknownGrace;
// then it closes out.
func (c *Client) pollStatuses(ctx context.Context, ids []string, out chan<- job.Status) {
	defer close(out)
	p := &poller{c: c, out: out, sent: map[string]uint64{}, queued: map[string]bool{}, unknownSince: map[string]time.Time{}}
	seen := map[string]bool{}
	for _, id := range ids {
		if !seen[id] {
			seen[id] = true
			p.open = append(p.open, id)
		}
	}
	for p.round(ctx) {
		select {
		case <-ctx.Done():
			return
		case <-time.After(pollEvery):
		}
	}
}

// round reads every open job's status once and sends what changed; false when the watch is
// over (every job terminal, or ctx ended).
func (p *poller) round(ctx context.Context) bool {
	keys := make([]string, len(p.open))
	for i, id := range p.open {
		keys[i] = p.c.ref(id).key()
	}
	results := getEach(ctx, p.c.status, keys)
	still := p.open[:0]
	for i, id := range p.open {
		done, ok := p.take(ctx, id, results[i])
		if !ok {
			return false
		}
		if !done {
			still = append(still, id)
		}
	}
	p.open = still
	return len(p.open) > 0 && ctx.Err() == nil
}

// take sends what one read of a job's status found, when it is new; done when it was the
// job's terminal status, ok false when ctx ended while sending.
func (p *poller) take(ctx context.Context, id string, r got) (done, ok bool) {
	switch {
	case !job.ValidID(id):
		return false, true // never has a status; read nothing under its name
	case errors.Is(r.err, jetstream.ErrKeyNotFound):
		return p.noStatus(ctx, id)
	case r.err != nil:
		return false, true // a timeout or a reconnection: the next round reads it again
	case r.entry.Revision() == p.sent[id]:
		return false, true
	}
	p.sent[id] = r.entry.Revision()
	st, err := decodeStatus(r.entry.Value())
	if err != nil {
		return false, true // what no worker wrote; the next revision may decode
	}
	st.ID = id
	return st.State.Terminal(), deliver(ctx, p.out, st)
}

// noStatus handles a job found without a status. While the job stream holds it, it is queued
// (sent once, the first time). While it does not, it is unknown: once it has been for
// UnknownGrace, done, and the watch ends for it with no terminal status sent. ok is false when
// ctx ended while sending.
func (p *poller) noStatus(ctx context.Context, id string) (done, ok bool) {
	if p.queued[id] || p.sent[id] > 0 {
		return false, true // known: a worker's status comes next
	}
	st, err := p.c.Status(ctx, id)
	switch {
	case errors.Is(err, ErrUnknownJob):
		first, seen := p.unknownSince[id]
		if !seen {
			p.unknownSince[id] = time.Now()
		}
		return seen && time.Since(first) >= UnknownGrace, true
	case err != nil || st.State != job.StateQueued:
		return false, true // a timeout, or a status written meanwhile: the next round reads it
	}
	p.queued[id] = true
	return false, deliver(ctx, p.out, st)
}
