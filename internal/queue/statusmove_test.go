package queue_test

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"slices"
	"strings"
	"testing"

	"github.com/nats-io/nats.go"

	"github.com/boxcar-run/boxcar/internal/config"
	"github.com/boxcar-run/boxcar/internal/job"
	"github.com/boxcar-run/boxcar/internal/queue"
)

// TestStatusesMoveToTenantBuckets is an upgrade from one status bucket for every tenant:
// `worker setup` copies the ended jobs' statuses into their tenants' buckets, where `submit
// list` lists them, and no other tenant's; a job an older worker still runs stays in the shared
// bucket, where its tenant reads it by its key, its end too; a worker of this version that
// writes such a job's status starts from the one there (its attempt, its end); and the next
// `worker setup` copies the end an older worker wrote meanwhile.
func TestStatusesMoveToTenantBuckets(t *testing.T) {
	t.Parallel()
	u := newUpgrade(t, true)
	nc, ctx, cfg := u.nc, u.ctx, u.cfg
	shared := u.olderBucket(t, cfg.StatusBucket, 16)
	older := func(tenant, id string, state job.State, attempt int) { // what an older worker writes
		t.Helper()
		data, err := json.Marshal(job.Status{ID: id, State: state, Attempt: attempt})
		if err == nil {
			_, err = shared.Put(ctx, tenant+"."+id, data)
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	done, running, late, other := job.NewID(), job.NewID(), job.NewID(), job.NewID()
	older("team-a", done, job.StateSucceeded, 1)
	older("team-a", running, job.StateRunning, 2)
	older("team-b", other, job.StateSucceeded, 1)
	tenants := map[string]config.Tenant{"team-a": {}, "team-b": {}}
	setUp := func() {
		t.Helper()
		admin, err := queue.NewAdmin(nc, cfg, tenants, slog.New(slog.DiscardHandler))
		if err == nil {
			err = admin.Declare(ctx)
		}
		if err != nil {
			t.Fatalf("worker setup: %v", err)
		}
	}
	setUp()

	a, err := queue.NewClient(ctx, nc, cfg, "team-a")
	if err != nil {
		t.Fatal(err)
	}
	if got := listed(ctx, t, a); !slices.Equal(got, []string{done}) {
		t.Errorf("team-a lists %v after setup, want its ended job %s alone", got, done)
	}
	wantState(ctx, t, a, running, job.StateRunning)
	older("team-a", running, job.StateSucceeded, 2)
	wantState(ctx, t, a, running, job.StateSucceeded)
	if _, err := a.Status(ctx, other); !errors.Is(err, queue.ErrUnknownJob) {
		t.Errorf("team-a reads team-b's job %s: %v, want unknown", other, err)
	}

	w, err := queue.NewConsumer(ctx, nc, cfg, tenants, slog.New(slog.DiscardHandler), nil)
	if err != nil {
		t.Fatal(err)
	}
	older("team-a", late, job.StateRunning, 3)
	if _, err := w.UpdateStatus(ctx, queue.Ref{Tenant: "team-a", ID: late}, func(*job.Status) {}, queue.ByAttempt(2)); !errors.Is(err, queue.ErrSuperseded) {
		t.Errorf("attempt 2 writes the status of a job whose attempt 3 an older worker claimed: %v, want superseded", err)
	}

	setUp()
	if got, want := listed(ctx, t, a), slices.Sorted(slices.Values([]string{done, running, late})); !slices.Equal(got, want) {
		t.Errorf("team-a lists %v after the second setup, want %v", got, want)
	}
	if got := listed(ctx, t, queueClient(ctx, t, nc, cfg, "team-b")); !slices.Equal(got, []string{other}) {
		t.Errorf("team-b lists %v, want %s alone", got, other)
	}
}

func queueClient(ctx context.Context, t *testing.T, nc *nats.Conn, cfg config.NATS, tenant string) *queue.Client {
	t.Helper()
	c, err := queue.NewClient(ctx, nc, cfg, tenant)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// listed is the ids `submit list` shows, sorted.
func listed(ctx context.Context, t *testing.T, c *queue.Client) []string {
	t.Helper()
	list, err := c.ListStatuses(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, st := range list {
		ids = append(ids, st.ID)
	}
	slices.Sort(ids)
	return ids
}

func wantState(ctx context.Context, t *testing.T, c *queue.Client, id string, want job.State) {
	t.Helper()
	st, err := c.Status(ctx, id)
	if err != nil || st.State != want {
		t.Errorf("status of %s = %v, %v; want %s", id, st.State, err, want)
	}
}

// TestStatusWriteWaitsForASharedBucketThatAnswersNobody: a worker of this version that writes
// the status of a job an older worker runs starts from the older worker's status in the shared
// bucket. When that bucket's stream answered nobody at that moment (its server restarting),
// the worker took it as holding nothing and wrote a status from scratch into the tenant's
// bucket (no state, no attempt), which from then on hid every status the older worker wrote
// for the job, its end too. The write now fails, to be tried again, while the stream is there.
func TestStatusWriteWaitsForASharedBucketThatAnswersNobody(t *testing.T) {
	t.Parallel()
	u, b, id := olderRunning(t)
	ctx, cfg := u.ctx, u.cfg
	name := "KV_" + cfg.StatusBucket
	answer := u.silence(t, name)
	_, werr := b.w.UpdateStatus(ctx, ref(id), job.RequestCancel)
	answer()
	if werr != nil && strings.Contains(werr.Error(), "%!") {
		t.Errorf("the write's error is garbled: %v", werr)
	}
	if werr == nil {
		st, err := b.c.Status(ctx, id)
		if err != nil || st.State != job.StateRunning || st.Attempt != 2 {
			t.Fatalf("the write while the shared bucket answered nobody left %+v, %v; want the older worker's running attempt 2 kept, or the write refused", st, err)
		}
	}
	st, err := b.w.UpdateStatus(ctx, ref(id), job.RequestCancel)
	if err != nil || st.State != job.StateRunning || st.Attempt != 2 || !st.CancelRequested {
		t.Errorf("the write once it answers: %+v, %v; want the older worker's running attempt 2, cancel requested", st, err)
	}
}

// olderRunning is an upgrade in which an older worker runs job id, at attempt 2, its status in
// the shared status bucket; b is a worker and a client of this version.
func olderRunning(t *testing.T) (u upgrade, b bundle, id string) {
	t.Helper()
	u = newUpgrade(t, true)
	shared := u.olderBucket(t, u.cfg.StatusBucket, 1)
	b = start(t, u.nc, u.cfg)
	id = job.NewID()
	if _, err := shared.Put(u.ctx, tenant+"."+id, mustMarshal(t, job.Status{ID: id, State: job.StateRunning, Attempt: 2})); err != nil {
		t.Fatal(err)
	}
	return u, b, id
}

// silence has the stream name answer no direct get, as while its server restarts, and returns
// what makes it answer again.
func (u upgrade) silence(t *testing.T, name string) (answer func()) {
	t.Helper()
	answering := streamConfig(t, u.js, name)
	silent := answering
	silent.AllowDirect = false
	if _, err := u.js.UpdateStream(u.ctx, silent); err != nil {
		t.Fatal(err)
	}
	return func() {
		t.Helper()
		if _, err := u.js.UpdateStream(u.ctx, answering); err != nil {
			t.Fatal(err)
		}
	}
}

// TestSubmitterReadsASharedBucketAgainOnceItAnswers: a submitter's read of a job's status that
// an older worker wrote in the shared bucket, made while the bucket's stream answers nobody
// (its leader being elected), finds none; its next read, once the stream answers, finds the
// older worker's running status. Before, the client took the stream as absent for a minute
// after one silent read, and `submit watch` called the running job unknown (or queued) for
// that minute.
func TestSubmitterReadsASharedBucketAgainOnceItAnswers(t *testing.T) {
	t.Parallel()
	u, b, id := olderRunning(t)
	ctx, cfg := u.ctx, u.cfg
	wantState(ctx, t, b.c, id, job.StateRunning)
	answer := u.silence(t, "KV_"+cfg.StatusBucket)
	_, _ = b.c.Status(ctx, id) // whatever it says, for this read alone
	answer()
	wantState(ctx, t, b.c, id, job.StateRunning)
}
