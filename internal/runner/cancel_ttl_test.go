package runner_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/boxcar-run/boxcar/internal/agent"
	"github.com/boxcar-run/boxcar/internal/config"
	"github.com/boxcar-run/boxcar/internal/job"
	"github.com/boxcar-run/boxcar/internal/queue"
	"github.com/boxcar-run/boxcar/internal/runner"
	"github.com/boxcar-run/boxcar/internal/store"
)

// setupStatusTTL is setup with the status and cancel buckets keeping an entry ttl after its
// last change (nats.status_ttl), and one slot.
func setupStatusTTL(t *testing.T, ttl time.Duration) *bundle {
	t.Helper()
	b := &bundle{t: t, storeDir: t.TempDir()}
	b.start(-1)
	cfg, err := config.Parse([]byte(strings.Replace(profiles, "concurrency: 2", "concurrency: 1", 1) + "\n"))
	if err != nil {
		t.Fatal(err)
	}
	cfg.NATS.StatusTTL = config.Duration(ttl)
	b.cfg = cfg
	b.nc, b.q = b.client()
	st, err := store.NewFile(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	b.shared = st
	b.store = store.ForTenant(st, job.DefaultTenant)
	return b
}

// TestCancelledQueuedJobNeverRunsOnceItsStatusExpired: a job cancelled while it waits in the
// queue is recorded cancelled (a terminal status) and its message stays in the stream until a
// worker takes it. The cancelled status expires nats.status_ttl after it was written, and a
// backlog that long is a big batch; the cancel request has no expiry until the job's cancelled
// end is committed, so the worker that finally takes the job finds it and never runs the job.
// Then the request expires as a status does.
func TestCancelledQueuedJobNeverRunsOnceItsStatusExpired(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		name string
		skew time.Duration // of the worker's clock against the NATS server's
		// another: a second worker, which takes no job, watches the requests too: it reads
		// the request of a job whose status says cancelled, and must keep it (it let it expire
		// as if the job's end were committed, and the job ran once both had expired).
		another bool
	}{
		{name: "clocks in step"},
		// The message's time is the server's: a worker 5 minutes behind it reads the job as
		// waiting 5 minutes less than it did, and its status as still there.
		{name: "worker clock 5m behind", skew: -5 * time.Minute},
		{name: "worker clock 5m ahead", skew: 5 * time.Minute},
		{name: "another worker watches", another: true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			testCancelledQueuedJobNeverRuns(t, func() time.Time { return time.Now().Add(tt.skew) }, tt.another)
		})
	}
}

// neverUp is a model gate that never opens: a worker behind it fetches no job.
type neverUp struct{}

func (neverUp) Up() bool { return false }
func (neverUp) Wait(ctx context.Context) error {
	<-ctx.Done()
	return context.Cause(ctx)
}

// statusRead tells read once the worker's queue has answered a status read of the job id.
type statusRead struct {
	runner.Queue
	id   string
	once sync.Once
	read chan struct{}
}

func (q *statusRead) Status(ctx context.Context, r queue.Ref) (job.Status, error) {
	st, err := q.Queue.Status(ctx, r)
	if r.ID == q.id {
		q.once.Do(func() { close(q.read) })
	}
	return st, err
}

// watchingWorker starts a worker that fetches no job and returns once its watch has read the
// status of the job id.
func (b *bundle) watchingWorker(id string) {
	b.t.Helper()
	q := &statusRead{id: id, read: make(chan struct{})}
	b.worker(agentFunc(func(context.Context, agent.Request) (agent.Result, error) {
		return agent.Result{}, errors.New("the watching worker ran a job")
	}), func(c *runner.Config) { q.Queue, c.Queue, c.ModelGate = c.Queue, q, neverUp{} })
	<-q.read
}

func testCancelledQueuedJobNeverRuns(t *testing.T, now func() time.Time, another bool) {
	const ttl = 2 * time.Second // stands for status_ttl: 24h and a day's backlog
	b := setupStatusTTL(t, ttl)
	ctx := context.Background()
	release := make(chan struct{})
	ran := make(chan string, 4)
	b.worker(agentFunc(func(ctx context.Context, req agent.Request) (agent.Result, error) {
		ran <- req.Task
		if req.Task == "busy" {
			<-release
		}
		return writeReport(ctx, req)
	}), func(c *runner.Config) { c.Now = now })
	busy := b.submitTask("p", "busy")
	if got := <-ran; got != "busy" {
		t.Fatalf("ran %q first", got)
	}
	// The one slot is taken: this job waits in the queue, and is cancelled there.
	queued := b.submitTask("p", "cancelled-while-queued")
	if _, err := b.q.Cancel(ctx, queued.ID, "tester"); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 10*time.Second, "the cancel recorded", func() bool {
		st, err := b.q.Status(ctx, queued.ID)
		return err == nil && st.State == job.StateCancelled
	})
	if another {
		b.watchingWorker(queued.ID)
	}
	time.Sleep(ttl + 2*time.Second) // the backlog outlasts status_ttl
	close(release)
	b.waitFinal(busy.ID, 20*time.Second)
	st := b.waitFinal(queued.ID, 20*time.Second)
	select {
	case task := <-ran:
		t.Errorf("the job cancelled while queued ran (task %q) and ended %s: a cancelled job is run once its status and cancel request expired", task, st.State)
	default:
	}
	if st.State != job.StateCancelled {
		t.Errorf("the job cancelled while queued ended %s, want cancelled", st.State)
	}
	js, err := jetstream.New(b.nc)
	if err != nil {
		t.Fatal(err)
	}
	kv, err := js.KeyValue(ctx, queue.CancelBucketOf(job.DefaultTenant))
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, 10*time.Second, "the cancel request expired once the cancelled end was committed", func() bool {
		_, err := kv.Get(ctx, job.DefaultTenant+"."+queued.ID)
		return errors.Is(err, jetstream.ErrKeyNotFound)
	})
}

// TestCancelOfAnEndedJobIsReleasedOnce: a cancel request written as the job ended (the
// client read it running) has no expiry; no settle releases it, as no attempt of the job saw
// it. A worker's watch finds the job ended and releases it, once: the release is a write every
// watch sees, and a second release would push its expiry back and be seen again.
func TestCancelOfAnEndedJobIsReleasedOnce(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	b.worker(agentFunc(writeReport))
	j := b.submit("p")
	if st := b.waitFinal(j.ID, 30*time.Second); st.State != job.StateSucceeded {
		t.Fatalf("job %s: %s", st.State, st.Error)
	}
	js, err := jetstream.New(b.nc)
	if err != nil {
		t.Fatal(err)
	}
	kv, err := js.KeyValue(ctx, queue.CancelBucketOf(job.DefaultTenant))
	if err != nil {
		t.Fatal(err)
	}
	key := job.DefaultTenant + "." + j.ID
	if _, err := kv.Create(ctx, key, []byte(`{"at":"2026-12-06T00:00:00Z","by":"tester"}`)); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 20*time.Second, "the watch to release the request of the ended job", func() bool { return cancelReleased(t, b, j.ID) })
	released, err := kv.Get(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	// Every worker's watch sees the release and finds the job ended again; a second worker
	// started now reads every request at its start.
	b.worker(agentFunc(writeReport))
	j2 := b.submit("p")
	b.waitFinal(j2.ID, 30*time.Second)
	e, err := kv.Get(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	if e.Revision() != released.Revision() {
		t.Errorf("the released request was written again (revision %d, was %d): each release pushes its expiry back", e.Revision(), released.Revision())
	}
}

// TestCancelOfAJobThatNeverWasExpires: a tenant with the NATS rights to request cancels writes
// one, as `submit cancel` does (no expiry), for an id no job ever had: `submit cancel` refuses
// an unknown job, the server does not. A worker's watch finds no status and no message of the
// job in the job stream, so no delivery can ever need the request: it gives it back to the
// bucket's expiry (status_ttl), rather than keep it for ever, and records no status for it.
func TestCancelOfAJobThatNeverWasExpires(t *testing.T) {
	t.Parallel()
	const ttl = 2 * time.Second // stands for status_ttl
	b := setupStatusTTL(t, ttl)
	ctx := context.Background()
	b.worker(agentFunc(writeReport))
	id := job.NewID()
	msg := nats.NewMsg("$KV." + queue.CancelBucketOf(job.DefaultTenant) + "." + job.DefaultTenant + "." + id)
	msg.Data = []byte(`{"at":"2026-01-02T03:04:05Z","by":"someone@somewhere"}`)
	msg.Header.Set("Nats-TTL", "never")
	js, err := jetstream.New(b.nc)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := js.PublishMsg(ctx, msg); err != nil {
		t.Fatal(err)
	}
	kv, err := js.KeyValue(ctx, queue.CancelBucketOf(job.DefaultTenant))
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, 10*ttl, "the request for a job that never was to expire", func() bool {
		_, err := kv.Get(ctx, job.DefaultTenant+"."+id)
		return errors.Is(err, jetstream.ErrKeyNotFound)
	})
	_, q := b.connect()
	if st, err := q.Status(ctx, queue.Ref{Tenant: job.DefaultTenant, ID: id}); !errors.Is(err, queue.ErrUnknownJob) {
		t.Errorf("a job that never was has the status %+v (%v); want none", st, err)
	}
}
