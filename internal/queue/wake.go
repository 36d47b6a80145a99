package queue

import (
	"context"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// queuedSubject is where the job stream republishes each job it stores, headers only:
// <jobs>-queued.T.J. A worker serving several tenants listens there while idle, so a new job
// of any tenant wakes it at once, instead of waiting for its turn in a round that asks each
// tenant's consumer idlePull in turn (a wait that grew with the number of tenants).
func queuedSubject(subject string) string { return subject + "-queued" }

// republish is a tenant's job stream's republish of what it stores, as queuedSubject says. Only a
// worker may subscribe there (natsconfig.Table): the notification names the job's tenant and
// id, never its body.
func republish(subject, tenant string) *jetstream.RePublish {
	return &jetstream.RePublish{Source: subject + "." + tenant + ".*", Destination: queuedSubject(subject) + "." + tenant + ".{{wildcard(1)}}", HeadersOnly: true}
}

// idleCheck is how long an idle worker that listens for new jobs waits before asking every
// tenant's consumer anyway: a notification is core NATS, at most once, and may be lost (a
// reconnect, a server that restarts).
const idleCheck = pullWait

// waker is an idle multi-tenant worker's ear for new jobs: one subscription per tenant served
// (a worker may subscribe to its tenants' notifications, not to a wildcard over all of them),
// each closing heard, so that every fetch waiting wakes (a fetch that looked into heard before
// its round and misses the notification during it wakes at once), and noting the tenant.
type waker struct {
	subs []*nats.Subscription

	mu     sync.Mutex
	heard  chan struct{} // closed and replaced at each notification
	tenant string        // the tenant of the last one
	idlers int           // fetches waiting in idle
	check  time.Duration // idleCheck (tests shorten it)
	// polling is set once a job was found without a notification after idleCheck: the
	// notifications do not reach this worker (no permission to subscribe, or a job stream set
	// up before they existed), so idle rounds ask each tenant in turn again, until one comes.
	polling bool
}

// listen subscribes to the notifications of the tenants' jobs. A subscription the server
// refuses says so only to the connection's error handler; the worker then finds its jobs by
// idleCheck's rounds and falls back to polling.
func listen(nc *nats.Conn, subject string, tenants []string) (*waker, error) {
	w := &waker{heard: make(chan struct{}), check: idleCheck}
	for _, tenant := range tenants {
		sub, err := nc.Subscribe(queuedSubject(subject)+"."+tenant+".*", func(*nats.Msg) { w.notify(tenant) })
		if err != nil {
			for _, s := range w.subs {
				_ = s.Unsubscribe()
			}
			return nil, err
		}
		w.subs = append(w.subs, sub)
	}
	return w, nil
}

func (w *waker) notify(tenant string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.tenant, w.polling = tenant, false
	close(w.heard)
	w.heard = make(chan struct{})
}

// ear is what the next notification closes, and whether the worker polls instead.
func (w *waker) ear() (<-chan struct{}, bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.heard, w.polling
}

// idle waits on ear for a notification of a new job (the tenant it names, and true), or for
// idleCheck (false).
func (w *waker) idle(ctx context.Context, ear <-chan struct{}) (tenant string, woken bool, err error) {
	w.mu.Lock()
	w.idlers++
	t := time.NewTimer(w.check)
	w.mu.Unlock()
	defer t.Stop()
	defer func() {
		w.mu.Lock()
		w.idlers--
		w.mu.Unlock()
	}()
	select {
	case <-ear:
		w.mu.Lock()
		defer w.mu.Unlock()
		return w.tenant, true, nil
	case <-t.C:
		return "", false, nil
	case <-ctx.Done():
		return "", false, ctx.Err()
	}
}

// unheard notes that a round after idleCheck found a job no notification announced, and
// reports whether that is news (the worker polls from now on, until a notification comes).
func (w *waker) unheard() bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	was := w.polling
	w.polling = true
	return !was
}
