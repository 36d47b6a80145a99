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
// submitted as another tenant, or one that left the job stream without a status (purged by an
// operator, removed by the stream's limits), is said unknown instead of watched until the
// timeout.
//
// A job being worked on is never unknown: the job stream keeps a message until its ack or
// term (work-queue retention), and a worker writes the job's status before either (the claim
// writes running; settle writes the end, then acks). So from its publish to its end a job has
// a message in the stream or a status, or both. A watch reads the two one after the other, not
// at once: a job that ends between the two reads (its status written, then acked) is found in
// neither for that round, and the next round reads its status. Only a job that stays in
// neither for the whole grace ends the watch.
const UnknownGrace = 5 * time.Second

// restreamEvery is how often a watch looks again in the job stream for a job it found there
// with no status (a stream lookup per job, where the status is a direct get): a job that then
// leaves the stream without a status is said unknown within UnknownGrace and this.
const restreamEvery = time.Second

// poller follows the statuses of some jobs of a client's tenant by direct gets, sending each
// job's status when its revision changes, until every one is terminal.
type poller struct {
	c    *Client
	out  chan<- job.Status
	open []string          // the jobs not terminal yet, in the order given
	sent map[string]uint64 // the revision of each job's status last sent
	// saidQueued are the jobs sent as queued: a job found in the job stream with no status is
	// said queued once, as its first status.
	saidQueued map[string]bool
	// inStreamAt is when each job with no status was last found in the job stream; it is
	// looked up there again restreamEvery later.
	inStreamAt map[string]time.Time
	// unknownSince is when each job was first found unknown, since it was last found with a
	// status or in the job stream.
	unknownSince map[string]time.Time
}

// pollStatuses sends, for each job of ids, its current status first (queued for one in the
// job stream with no status yet), then each change a round sees, until ctx ends or every job
// reached a terminal state (the last value sent for it) or stayed unknown for UnknownGrace;
// then it closes out.
func (c *Client) pollStatuses(ctx context.Context, ids []string, out chan<- job.Status) {
	defer close(out)
	p := &poller{c: c, out: out, sent: map[string]uint64{}, saidQueued: map[string]bool{},
		inStreamAt: map[string]time.Time{}, unknownSince: map[string]time.Time{}}
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
	}
	delete(p.unknownSince, id) // it has a status
	if r.entry.Revision() == p.sent[id] {
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
// (sent once, the first time, unless it had a status before). While it does not, it is
// unknown, whether or not it was queued before: once it has been for UnknownGrace, done, and
// the watch ends for it with no terminal status sent. ok is false when ctx ended while
// sending.
func (p *poller) noStatus(ctx context.Context, id string) (done, ok bool) {
	if at, found := p.inStreamAt[id]; found && time.Since(at) < restreamEvery {
		return false, true // queued a moment ago: look again later
	}
	st, err := p.c.Status(ctx, id)
	switch {
	case errors.Is(err, ErrUnknownJob):
		delete(p.inStreamAt, id)
		return p.unknownFor(id) >= UnknownGrace, true
	case err != nil || st.State != job.StateQueued:
		return false, true // a timeout, or a status written meanwhile: the next round reads it
	}
	p.inStreamAt[id] = time.Now()
	delete(p.unknownSince, id)
	if p.saidQueued[id] || p.sent[id] > 0 {
		return false, true
	}
	p.saidQueued[id] = true
	return false, deliver(ctx, p.out, st)
}

// unknownFor is how long job id has been found unknown, round after round; zero the first time.
func (p *poller) unknownFor(id string) time.Duration {
	first, seen := p.unknownSince[id]
	if !seen {
		p.unknownSince[id] = time.Now()
		return 0
	}
	return time.Since(first)
}
