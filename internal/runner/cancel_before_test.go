package runner

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"testing"

	"github.com/boxcar-run/boxcar/internal/job"
	"github.com/boxcar-run/boxcar/internal/queue"
)

// askedQueue answers CancelAsked as it is told, holds every job it is asked about, and records
// the status writes of the cancels applied.
type askedQueue struct {
	statusQueue
	asked bool
	err   error

	mu      sync.Mutex
	looked  int
	written []queue.Ref
}

func (q *askedQueue) CancelAsked(context.Context, queue.Ref) (bool, error) {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.looked++
	return q.asked, q.err
}

func (q *askedQueue) Queued(context.Context, queue.Ref) (bool, error) { return true, nil }

func (q *askedQueue) UpdateStatus(_ context.Context, r queue.Ref, change func(*job.Status), _ ...queue.StatusCond) (job.Status, error) {
	var st job.Status
	change(&st)
	q.mu.Lock()
	defer q.mu.Unlock()
	q.written = append(q.written, r)
	return st, nil
}

// TestBeforeLooksUpTheJobsOwnRequest: an attempt that begins while its tenant's cancel watch
// is behind looks up its job's own request, and applies it (the status says cancelled before
// the claim reads it); while the watch is up to date, or for a tenant the worker does not
// watch, it looks up nothing.
func TestBeforeLooksUpTheJobsOwnRequest(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		name          string
		tenant        string
		upToDate      bool
		asked         bool
		looked, wrote int
	}{
		{name: "watch behind, request there", tenant: "team-a", asked: true, looked: 1, wrote: 1},
		{name: "watch behind, no request", tenant: "team-a", looked: 1},
		{name: "watch up to date", tenant: "team-a", upToDate: true, asked: true},
		{name: "tenant not watched", tenant: "team-z", asked: true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			q := &askedQueue{asked: tt.asked}
			c := newCancelWatch(q, slog.New(slog.DiscardHandler))
			c.tenants["team-a"] = newTenantWatch()
			if tt.upToDate {
				c.tenants["team-a"].set(false)
			}
			c.before(context.Background(), queue.Ref{Tenant: tt.tenant, ID: job.NewID()})
			if q.looked != tt.looked || len(q.written) != tt.wrote {
				t.Errorf("looked up %d requests and wrote %d statuses; want %d and %d", q.looked, len(q.written), tt.looked, tt.wrote)
			}
		})
	}
}

// TestBeforeWaitsForTheWatchWhenNATSCannotSay: when the cancel bucket cannot be read, an
// attempt whose tenant's watch is behind waits for the watch to catch up, as every attempt of a
// starting worker did before attempts looked up their own.
func TestBeforeWaitsForTheWatchWhenNATSCannotSay(t *testing.T) {
	t.Parallel()
	warned := make(chan struct{}, 1)
	log := slog.New(signalHandler{Handler: slog.DiscardHandler, says: "waiting for the cancel watch", said: warned})
	c := newCancelWatch(&askedQueue{err: errors.New("nats: timeout")}, log)
	tw := newTenantWatch()
	c.tenants["team-a"] = tw
	done := make(chan struct{})
	go func() {
		defer close(done)
		c.before(context.Background(), queue.Ref{Tenant: "team-a", ID: job.NewID()})
	}()
	<-warned
	select {
	case <-done:
		t.Fatal("the attempt went on while the watch was behind, not knowing whether its job was cancelled")
	default:
	}
	tw.set(false)
	<-done
}

// signalHandler tells said when a record whose message contains says is logged.
type signalHandler struct {
	slog.Handler
	says string
	said chan<- struct{}
}

func (h signalHandler) Enabled(context.Context, slog.Level) bool { return true }

func (h signalHandler) Handle(_ context.Context, r slog.Record) error {
	if strings.Contains(r.Message, h.says) {
		select {
		case h.said <- struct{}{}:
		default:
		}
	}
	return nil
}

// failingQueue delivers one request on the tenant's watch, then word that the watch is up to
// date, and fails the first status read of the request's job as NATS answering late does.
type failingQueue struct {
	askedQueue
	r     queue.Ref
	reads int
}

func (q *failingQueue) Tenants() []string { return []string{q.r.Tenant} }

func (q *failingQueue) WatchCancels(ctx context.Context, _ string) (<-chan queue.CancelUpdate, error) {
	out := make(chan queue.CancelUpdate)
	go func() {
		defer close(out)
		for _, u := range []queue.CancelUpdate{{Ref: q.r}, {}} {
			select {
			case out <- u:
			case <-ctx.Done():
				return
			}
		}
		<-ctx.Done()
	}()
	return out, nil
}

func (q *failingQueue) Status(ctx context.Context, r queue.Ref) (job.Status, error) {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.reads++
	if q.reads == 1 {
		return job.Status{}, context.DeadlineExceeded
	}
	return job.Status{}, queue.ErrUnknownJob
}

// TestWatchTriesAFailedRequestAgain: a request whose apply NATS fails (a status read that
// times out) is tried again, and the tenant's watch says it is behind until it is carried out.
// (It was dropped, the watch saying it was up to date, until the watch started again.)
func TestWatchTriesAFailedRequestAgain(t *testing.T) {
	t.Parallel()
	r := queue.Ref{Tenant: "team-a", ID: job.NewID()}
	q := &failingQueue{r: r}
	c := newCancelWatch(q, slog.New(slog.DiscardHandler))
	ctx, cancel := context.WithCancel(context.Background())
	stopped := c.start(ctx)
	defer func() { cancel(); <-stopped }()
	c.mu.Lock()
	tw := c.tenants[r.Tenant]
	c.mu.Unlock()
	for behind, ready := tw.state(); behind; behind, ready = tw.state() {
		<-ready
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	if len(q.written) != 1 || q.written[0] != r {
		t.Errorf("the watch is up to date with the statuses of %v written after %d status reads; want the request's job's, after a second read", q.written, q.reads)
	}
}

// claimingQueue starts an attempt of the job as its status is read: the attempt adds its hook
// and claims (the status says running) between the watch's stop and its read.
type claimingQueue struct {
	askedQueue
	claim func()
}

func (q *claimingQueue) Status(context.Context, queue.Ref) (job.Status, error) {
	q.claim()
	return job.Status{State: job.StateRunning}, nil
}

// TestApplyStopsAnAttemptThatClaimedDuringIt: an attempt that begins while a request is being
// applied (after the watch's stop, before its status write) is stopped too. Its hook is in
// place before its claim, and the status write that says cancel_requested comes after the
// claim's, so the stop after that write reaches it; a claim after the write reads the request
// itself. (It was stopped only before the read: the job ran on, its status cancel_requested.)
func TestApplyStopsAnAttemptThatClaimedDuringIt(t *testing.T) {
	t.Parallel()
	r := queue.Ref{Tenant: "team-a", ID: job.NewID()}
	stopped := make(chan error, 1)
	c := newCancelWatch(nil, slog.New(slog.DiscardHandler))
	q := &claimingQueue{claim: func() {
		c.add(r, func(err error) { stopped <- err })
	}}
	c.q = q
	if err := c.apply(context.Background(), r); err != nil {
		t.Fatalf("apply: %v", err)
	}
	select {
	case err := <-stopped:
		if !errors.Is(err, errCancelled) {
			t.Errorf("the attempt was stopped with %v, want errCancelled", err)
		}
	default:
		t.Errorf("the attempt that claimed while the request was applied runs on (status written for %v)", q.written)
	}
}
