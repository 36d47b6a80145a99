//go:build integration

package tenancy

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/boxcar-run/boxcar/internal/config"
	"github.com/boxcar-run/boxcar/internal/job"
	"github.com/boxcar-run/boxcar/internal/queue"
)

// twoTenants is the worker config's tenants of the deployment.
var twoTenants = map[string]config.Tenant{"team-a": {Profiles: []string{"p"}}, "team-b": {Profiles: []string{"p"}}}

// setUp declares the layout as `worker setup` does, with the operator's identity.
func setUp(t *testing.T, d *deployment) config.NATS {
	t.Helper()
	return setUpWith(t, d, config.Config{}.WithDefaults().NATS)
}

// setUpWith declares the layout as `worker setup` does with cfg, with the operator's identity.
func setUpWith(t *testing.T, d *deployment, cfg config.NATS) config.NATS {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	admin, err := queue.NewAdmin(d.connect(t, "operator").nc, cfg, twoTenants, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	if err := admin.Declare(ctx); err != nil {
		t.Fatalf("worker setup: %v", err)
	}
	return cfg
}

// TestMessageIDCannotDropAnotherTenantsJob: team-a's submitter, allowed to publish only on its
// own subjects, publishes there with the Nats-Msg-Id header team-b's next job would carry;
// team-b's submission of that job (through queue.Client, what `submit run` uses) is queued,
// not dropped as a duplicate, and team-b's worker consumer delivers it under team-b's id. A
// second submission of the same job by team-b is still recognised as one, and not queued twice.
func TestMessageIDCannotDropAnotherTenantsJob(t *testing.T) {
	t.Parallel()
	d := deploy(t)
	cfg := setUp(t, d)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	victim := job.Job{Version: job.Version, ID: job.NewID(), Profile: "p", Task: "team-b's task", SubmittedAt: time.Now().UTC()}
	mallory := d.connect(t, "team-a-submitter")
	if _, err := mallory.js.Publish(ctx, cfg.Subject+".team-a."+job.NewID(), []byte(`{"id":"x","profile":"p","task":"pre-empt"}`),
		jetstream.WithMsgID("team-b."+victim.ID)); err != nil {
		t.Fatalf("team-a publishes on its own subject: %v", err)
	}

	b, err := queue.NewClient(ctx, d.connect(t, "team-b-submitter").nc, cfg, "team-b")
	if err != nil {
		t.Fatal(err)
	}
	dup, err := b.Publish(ctx, victim)
	if err != nil {
		t.Fatalf("team-b submits %s: %v", victim.ID, err)
	}
	if dup {
		t.Fatalf("team-b's job %s was dropped as a duplicate of the message team-a published with its id", victim.ID)
	}
	if st, err := b.Status(ctx, victim.ID); err != nil || st.State != job.StateQueued {
		t.Fatalf("team-b's job after it was submitted: %+v, %v; want queued", st, err)
	}
	if dup, err := b.Publish(ctx, victim); err != nil || !dup {
		t.Errorf("team-b submits %s again: duplicate %v, %v; want a duplicate, not a second job", victim.ID, dup, err)
	}

	w, err := queue.NewConsumer(ctx, d.connect(t, "worker").nc, cfg, map[string]config.Tenant{"team-b": twoTenants["team-b"]}, slog.New(slog.DiscardHandler), nil)
	if err != nil {
		t.Fatal(err)
	}
	fctx, fcancel := context.WithTimeout(ctx, 30*time.Second)
	defer fcancel()
	del, err := w.Fetch(fctx)
	if err != nil {
		t.Fatalf("team-b's worker consumer delivers nothing: %v", err)
	}
	if del.Tenant != "team-b" || del.JobID != victim.ID {
		t.Fatalf("delivered %s/%s, want team-b/%s", del.Tenant, del.JobID, victim.ID)
	}
	if err := del.Ack(ctx); err != nil {
		t.Fatal(err)
	}
	actx, acancel := context.WithTimeout(ctx, 2*time.Second)
	defer acancel()
	if again, err := w.Fetch(actx); err == nil {
		t.Errorf("team-b's job was queued twice: delivered %s again", again.JobID)
	}
}
