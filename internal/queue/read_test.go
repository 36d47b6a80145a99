package queue_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/boxcar-run/boxcar/internal/job"
	"github.com/boxcar-run/boxcar/internal/queue"
)

// A tenant's Client reads without consumers (a tenant may create none: the server checks no
// consumer's deliver subject): listing, watching, the history and the approvals leave no
// consumer on the buckets, even while a watch runs, and a listing leaves out a deleted key.
func TestClientReadsCreateNoConsumer(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	kept, gone := b.submit(t), b.submit(t)
	for _, id := range []string{kept.ID, gone.ID} {
		if _, err := b.w.UpdateStatus(ctx, ref(id), func(st *job.Status) { st.State = job.StateRunning }); err != nil {
			t.Fatal(err)
		}
	}
	status, err := b.js.KeyValue(ctx, queue.StatusBucket(b.cfg, tenant))
	if err != nil {
		t.Fatal(err)
	}
	if err := status.Delete(ctx, tenant+"."+gone.ID); err != nil {
		t.Fatal(err)
	}
	updates, err := b.c.WatchStatuses(ctx, []string{kept.ID})
	if err != nil {
		t.Fatal(err)
	}
	if st := <-updates; st.ID != kept.ID || st.State != job.StateRunning {
		t.Fatalf("watch's first status = %+v; want %s running", st, kept.ID)
	}
	list, err := b.c.ListStatuses(ctx, func(st job.Status) bool { return st.State == job.StateRunning })
	if err != nil || len(list) != 1 || list[0].ID != kept.ID {
		t.Errorf("list = %+v, %v; want %s alone (the other's status deleted)", list, err, kept.ID)
	}
	if steps, err := b.c.StatusHistory(ctx, kept.ID); err != nil || len(steps) != 1 || steps[0].State != job.StateRunning {
		t.Errorf("history = %+v, %v; want the current step", steps, err)
	}
	if _, _, err := b.c.PendingApprovals(ctx, ""); err != nil {
		t.Errorf("approvals: %v", err)
	}
	if _, err := b.c.LiveProfiles(ctx); !errors.Is(err, queue.ErrNoProfiles) {
		t.Errorf("profiles: %v; want ErrNoProfiles", err)
	}
	for _, bucket := range []string{queue.StatusBucket(b.cfg, tenant), queue.ApprovalsBucket(b.cfg, tenant), queue.ProfilesBucket} {
		s, err := b.js.Stream(ctx, "KV_"+bucket)
		if errors.Is(err, jetstream.ErrStreamNotFound) {
			continue
		}
		if err != nil {
			t.Fatal(err)
		}
		if n := s.CachedInfo().State.Consumers; n != 0 {
			t.Errorf("bucket %s has %d consumers while the client watches; want none", bucket, n)
		}
	}
}
