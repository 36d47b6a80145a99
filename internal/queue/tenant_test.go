package queue_test

import (
	"bytes"
	"context"
	"encoding/json"
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
	w := b.open(t, b.cfg, tenants, nil)
	a, bb := b.client(t, "team-a"), b.client(t, "team-b")

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
	w, a := b.open(t, b.cfg, tenants, &log), b.client(t, "team-a")
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
	j := newJob(t)
	if _, err := b.client(t, "team-b").Publish(ctx, j); err != nil {
		t.Fatal(err)
	}
	if d := fetch(t, w, 10*time.Second); d.Tenant != "team-b" || d.JobID != j.ID {
		t.Errorf("fetched %s of %s, want team-b's %s", d.JobID, d.Tenant, j.ID)
	}
	if err := first.Ack(ctx); err != nil {
		t.Fatal(err)
	}
}

// TestJobsOfATenantNoWorkerServes: a tenant removed from the config leaves no job waiting for a
// worker that never comes. The next setup dead-letters its queued job as unknown_tenant, with
// the message, removes it and the tenant's consumer, and says so; the other tenants' jobs stay.
// Afterwards the tenant has no job stream: its client is told at once (ErrNotServed), and a
// raw publish finds no stream.
func TestJobsOfATenantNoWorkerServes(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	three := map[string]config.Tenant{"team-a": {}, "team-b": {}, "team-c": {}}
	b.open(t, b.cfg, three, nil)
	jc, ja := newJob(t), newJob(t)
	for c, j := range map[*queue.Client]job.Job{b.client(t, "team-c"): jc, b.client(t, "team-a"): ja} {
		if _, err := c.Publish(ctx, j); err != nil {
			t.Fatal(err)
		}
	}

	// team-c is removed from the config. A worker started with it leaves team-c to the
	// workers that still serve it: only setup retires a tenant.
	var wlog bytes.Buffer
	two := map[string]config.Tenant{"team-a": {}, "team-b": {}}
	w := b.open(t, b.cfg, two, &wlog)
	if _, err := b.js.Consumer(ctx, queue.JobStream(b.cfg, "team-c"), b.cfg.Consumer+"-team-c"); err != nil {
		t.Errorf("team-c's consumer after a worker without it started: %v; want it kept", err)
	}
	if !strings.Contains(wlog.String(), "tenants this worker's tenants: does not list") || !strings.Contains(wlog.String(), "team-c") {
		t.Errorf("the worker without team-c does not say it leaves team-c's jobs:\n%s", wlog.String())
	}
	refC := queue.Ref{Tenant: "team-c", ID: jc.ID}
	if _, err := queue.DeadLetterOf(ctx, b.nc, b.cfg, refC); !errors.Is(err, jetstream.ErrMsgNotFound) {
		t.Errorf("team-c's job after a worker without it started: %v; want it still queued", err)
	}
	var log bytes.Buffer
	admin, err := queue.NewAdmin(b.nc, b.cfg, two, slog.New(slog.NewTextHandler(&log, nil)))
	if err != nil {
		t.Fatal(err)
	}
	if err := admin.Declare(ctx); err != nil {
		t.Fatal(err)
	}
	data, err := queue.DeadLetterOf(ctx, b.nc, b.cfg, refC)
	if err != nil {
		t.Fatalf("no dead letter for team-c's job: %v\n%s", err, log.String())
	}
	var dl queue.DeadLetter
	if err := json.Unmarshal(data, &dl); err != nil {
		t.Fatal(err)
	}
	if orig, err := job.Decode(dl.Original); dl.Reason != queue.ReasonUnknownTenant || dl.Tenant != "team-c" || dl.JobID != jc.ID || err != nil || orig.ID != jc.ID ||
		!strings.Contains(dl.Error, "team-a, team-b") {
		t.Errorf("dead letter %+v (%v); want team-c's job, unknown_tenant, its message and the tenants served", dl, err)
	}
	if _, err := b.js.Consumer(ctx, queue.JobStream(b.cfg, "team-c"), b.cfg.Consumer+"-team-c"); !errors.Is(err, jetstream.ErrStreamNotFound) {
		t.Errorf("team-c's stream and consumer after it was removed from the config: %v; want them gone", err)
	}
	for _, want := range []string{"dead-lettered the jobs of tenants the config does not list", "jobs=1", "boxcar-workers-team-c", "removed the job stream of a tenant the config does not list"} {
		if !strings.Contains(log.String(), want) {
			t.Errorf("setup's log does not say %q:\n%s", want, log.String())
		}
	}
	d := fetch(t, w, 10*time.Second)
	if d.Tenant != "team-a" || d.JobID != ja.ID {
		t.Errorf("delivered %s/%s, want team-a's job %s, still queued", d.Tenant, d.JobID, ja.ID)
	}
	if err := d.Ack(ctx); err != nil {
		t.Fatal(err)
	}

	if _, err := queue.NewClient(ctx, b.nc, b.cfg, "team-c"); !errors.Is(err, queue.ErrNotServed) {
		t.Errorf("team-c's client once no worker serves it: %v; want ErrNotServed", err)
	}
	if _, err := b.js.Publish(ctx, b.cfg.Subject+".team-c."+newJob(t).ID, []byte(`{}`)); !errors.Is(err, jetstream.ErrNoStreamResponse) {
		t.Errorf("a raw publish for team-c: %v; want no stream to take it", err)
	}
	if _, err := b.js.Stream(ctx, queue.JobStream(b.cfg, "team-c")); !errors.Is(err, jetstream.ErrStreamNotFound) {
		t.Errorf("team-c's job stream after it was removed from the config: %v; want it gone", err)
	}
}

// TestPullEndsWithItsContext: a pull waiting on a tenant's consumer ends when its context
// does (a worker's stop), not when its wait runs out: an hour here, so the test's own wait
// would fail first.
func TestPullEndsWithItsContext(t *testing.T) {
	t.Parallel()
	b := setup(t)
	w := b.open(t, b.cfg, map[string]config.Tenant{"team-a": {}, "team-b": {}}, nil)
	cons, err := b.js.Consumer(t.Context(), queue.JobStream(b.cfg, "team-a"), b.cfg.Consumer+"-team-a")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	done := make(chan error, 1)
	go func() {
		_, err := w.PullOne(ctx, "team-a", time.Hour)
		done <- err
	}()
	harness.Wait(t, "the pull waiting on team-a's consumer", func() (bool, error) {
		info, err := cons.Info(t.Context())
		return err == nil && info.NumWaiting > 0, err
	})
	cancel()
	select {
	case err := <-done:
		if !errors.Is(err, context.Canceled) {
			t.Errorf("the pull ended with %v, want context.Canceled", err)
		}
	case <-time.After(harness.Timeout(time.Minute)):
		t.Fatal("the pull did not end with its context")
	}

	// The server sends nothing to the pull that ended: the next job of team-a is fetched at
	// its first attempt.
	j := newJob(t)
	if _, err := b.client(t, "team-a").Publish(t.Context(), j); err != nil {
		t.Fatal(err)
	}
	d := fetch(t, w, harness.Timeout(30*time.Second))
	if d.JobID != j.ID || d.Attempt != 1 {
		t.Errorf("fetched %s attempt %d, want %s at its first attempt", d.JobID, d.Attempt, j.ID)
	}
	if err := d.Ack(t.Context()); err != nil {
		t.Fatal(err)
	}
}
