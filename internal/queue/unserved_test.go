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
)

// TestJobsOfATenantNoWorkerServes: a tenant removed from the config leaves no job waiting for a
// worker that never comes. The next setup dead-letters its queued job as unknown_tenant, with
// the message, removes it and the tenant's consumer, and says so; the other tenants' jobs stay.
// Afterwards the job stream takes no job of that tenant: its client is told at once
// (ErrNotServed), and a raw publish finds no stream.
func TestJobsOfATenantNoWorkerServes(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	three := map[string]config.Tenant{"team-a": {}, "team-b": {}, "team-c": {}}
	if _, err := queue.Open(ctx, b.nc, b.cfg, three, slog.New(slog.DiscardHandler)); err != nil {
		t.Fatal(err)
	}
	client := func(tenant string) *queue.Client {
		c, err := queue.NewClient(ctx, b.nc, b.cfg, tenant)
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	jc, ja := newJob(t), newJob(t)
	for c, j := range map[*queue.Client]job.Job{client("team-c"): jc, client("team-a"): ja} {
		if _, err := c.Publish(ctx, j); err != nil {
			t.Fatal(err)
		}
	}

	// team-c is removed from the config.
	var log bytes.Buffer
	two := map[string]config.Tenant{"team-a": {}, "team-b": {}}
	w, err := queue.Open(ctx, b.nc, b.cfg, two, slog.New(slog.NewTextHandler(&log, nil)))
	if err != nil {
		t.Fatal(err)
	}
	dlq, err := b.js.Stream(ctx, b.cfg.DeadLetterStream)
	if err != nil {
		t.Fatal(err)
	}
	msg, err := dlq.GetLastMsgForSubject(ctx, b.cfg.DeadLetterStream+".team-c."+jc.ID)
	if err != nil {
		t.Fatalf("no dead letter for team-c's job: %v", err)
	}
	var dl queue.DeadLetter
	if err := json.Unmarshal(msg.Data, &dl); err != nil {
		t.Fatal(err)
	}
	if orig, err := job.Decode(dl.Original); dl.Reason != queue.ReasonUnknownTenant || dl.Tenant != "team-c" || dl.JobID != jc.ID || err != nil || orig.ID != jc.ID ||
		!strings.Contains(dl.Error, "team-a, team-b") {
		t.Errorf("dead letter %+v (%v); want team-c's job, unknown_tenant, its message and the tenants served", dl, err)
	}
	if _, err := b.js.Consumer(ctx, b.cfg.Stream, b.cfg.Consumer+"-team-c"); !errors.Is(err, jetstream.ErrConsumerNotFound) {
		t.Errorf("team-c's consumer after it was removed from the config: %v; want it gone", err)
	}
	for _, want := range []string{"dead-lettered the jobs of tenants the config does not list", "jobs=1", "boxcar-workers-team-c"} {
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

	if _, err := client("team-c").Publish(ctx, newJob(t)); !errors.Is(err, queue.ErrNotServed) {
		t.Errorf("team-c submits once no worker serves it: %v; want ErrNotServed", err)
	}
	if _, err := b.js.Publish(ctx, b.cfg.Subject+".team-c."+newJob(t).ID, []byte(`{}`)); !errors.Is(err, jetstream.ErrNoStreamResponse) {
		t.Errorf("a raw publish for team-c: %v; want no stream to take it", err)
	}
	if info, err := b.js.Stream(ctx, b.cfg.Stream); err != nil || info.CachedInfo().State.Msgs != 0 {
		t.Errorf("the job stream holds %v messages (%v); want none", info.CachedInfo().State.Msgs, err)
	}
}
