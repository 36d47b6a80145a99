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

// poller follows the statuses of some jobs of a client's tenant by direct gets, sending each
// job's status when its revision changes, until every one is terminal.
type poller struct {
	c    *Client
	out  chan<- job.Status
	open []string          // the jobs not terminal yet, in the order given
	sent map[string]uint64 // the revision of each job's status last sent
	// asked are the jobs without a status whose presence in the job stream was asked: a job
	// no worker has taken yet is said queued, once, as its first status.
	asked map[string]bool
}

// pollStatuses sends, for each job of ids, its current status first (queued for one in the
// job stream with no status yet), then each change a round sees, until ctx ends or every job
// reached a terminal state (the last value sent for it); then it closes out.
func (c *Client) pollStatuses(ctx context.Context, ids []string, out chan<- job.Status) {
	defer close(out)
	p := &poller{c: c, out: out, sent: map[string]uint64{}, asked: map[string]bool{}}
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
		return false, p.sayQueued(ctx, id)
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

// sayQueued sends, the first time a job is found without a status, queued when the job stream
// holds it; false when ctx ended while sending.
func (p *poller) sayQueued(ctx context.Context, id string) bool {
	if p.asked[id] || p.sent[id] > 0 {
		return true
	}
	p.asked[id] = true
	st, err := p.c.Status(ctx, id)
	if err != nil || st.State != job.StateQueued {
		return true // unknown yet, or a status written meanwhile: the next round reads it
	}
	return deliver(ctx, p.out, st)
}
