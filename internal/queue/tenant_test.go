package queue_test

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/boxcar-run/boxcar/internal/config"
	"github.com/boxcar-run/boxcar/internal/job"
	"github.com/boxcar-run/boxcar/internal/queue"
	"github.com/boxcar-run/boxcar/test/harness"
)

// TestTenantComesFromTheSubject: the worker takes a job's tenant and id from the subject it
// came on, whatever its payload claims, and a client of one tenant neither sees nor cancels
// another tenant's job of the same id.
func TestTenantComesFromTheSubject(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	tenants := map[string]config.Tenant{"team-a": {Profiles: []string{"p"}}, "team-b": {Profiles: []string{"p"}}}
	w, err := queue.Open(ctx, b.nc, b.cfg, tenants, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	clientOf := func(tenant string) *queue.Client {
		c, err := queue.NewClient(ctx, b.nc, b.cfg, tenant)
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	a, bb := clientOf("team-a"), clientOf("team-b")

	// team-b's job, whose payload claims team-a.
	j := newJob(t)
	j.Tenant = "team-a"
	data, err := j.Encode()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.js.Publish(ctx, b.cfg.Subject+".team-b."+j.ID, data, jetstream.WithMsgID("team-b."+j.ID)); err != nil {
		t.Fatal(err)
	}
	d := fetch(t, w, 10*time.Second)
	if d.Tenant != "team-b" || d.JobID != j.ID {
		t.Fatalf("delivery of tenant %q, job %q; want team-b's %s, from the subject", d.Tenant, d.JobID, j.ID)
	}
	if _, err := w.UpdateStatus(ctx, d.Ref(), func(s *job.Status) { s.State = job.StateRunning }); err != nil {
		t.Fatal(err)
	}

	if st, err := bb.Status(ctx, j.ID); err != nil || st.State != job.StateRunning {
		t.Errorf("team-b's status of its job: %+v, %v; want running", st, err)
	}
	if st, err := a.Status(ctx, j.ID); !errors.Is(err, queue.ErrUnknownJob) {
		t.Errorf("team-a's status of team-b's job: %+v, %v; want unknown", st, err)
	}
	if _, err := a.Cancel(ctx, j.ID, "mallory"); !errors.Is(err, queue.ErrUnknownJob) {
		t.Errorf("team-a cancels team-b's job: %v; want unknown", err)
	}
	if list, err := a.ListStatuses(ctx, nil); err != nil || len(list) != 0 {
		t.Errorf("team-a's list: %+v, %v; want nothing of team-b's", list, err)
	}
	if list, err := bb.ListStatuses(ctx, nil); err != nil || len(list) != 1 || list[0].ID != j.ID {
		t.Errorf("team-b's list: %+v, %v; want its job", list, err)
	}
	if err := d.Ack(ctx); err != nil {
		t.Fatal(err)
	}
}

// TestTenantAtItsMaxConcurrentIsNoFailure: a tenant whose jobs in flight reached its
// max_concurrent has more waiting; a worker's fetch finds nothing to take there, which is no
// failure to log, and takes another tenant's job as soon as there is one.
func TestTenantAtItsMaxConcurrentIsNoFailure(t *testing.T) {
	t.Parallel()
	b := setup(t, func(c *config.NATS) { c.AckWait = config.Duration(time.Hour) })
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	tenants := map[string]config.Tenant{"team-a": {Profiles: []string{"p"}, MaxConcurrent: 1}, "team-b": {Profiles: []string{"p"}}}
	var log harness.LogBuffer
	w, err := queue.Open(ctx, b.nc, b.cfg, tenants, slog.New(slog.NewTextHandler(&log, nil)))
	if err != nil {
		t.Fatal(err)
	}
	a, err := queue.NewClient(ctx, b.nc, b.cfg, "team-a")
	if err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if _, err := a.Publish(ctx, newJob(t)); err != nil {
			t.Fatal(err)
		}
	}
	first := fetch(t, w, 10*time.Second)
	wait, stop := context.WithTimeout(ctx, 3*time.Second)
	defer stop()
	if d, err := w.Fetch(wait); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("fetch with team-a at its max_concurrent: %v, %v; want nothing until the deadline", d, err)
	}
	if strings.Contains(log.String(), "fetch failed") {
		t.Errorf("a tenant at its max_concurrent was logged as a failure:\n%s", log.String())
	}
	c, err := queue.NewClient(ctx, b.nc, b.cfg, "team-b")
	if err != nil {
		t.Fatal(err)
	}
	j := newJob(t)
	if _, err := c.Publish(ctx, j); err != nil {
		t.Fatal(err)
	}
	if d := fetch(t, w, 10*time.Second); d.Tenant != "team-b" || d.JobID != j.ID {
		t.Errorf("fetched %s of %s, want team-b's %s", d.JobID, d.Tenant, j.ID)
	}
	if err := first.Ack(ctx); err != nil {
		t.Fatal(err)
	}
}
