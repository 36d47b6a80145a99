package queue_test

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"

	"github.com/boxcar-run/boxcar/internal/config"
	"github.com/boxcar-run/boxcar/internal/queue"
	"github.com/boxcar-run/boxcar/internal/queue/natsauthtest"
)

// TestWorkerWithoutOperatorRightsBinds: a worker whose NATS user may not create or update
// streams, consumers or buckets ($JS.API.STREAM.CREATE and the like denied) stops with an error
// naming `worker setup` while nothing is declared, and, once the operator declared everything,
// binds to it and takes jobs, changing nothing.
func TestWorkerWithoutOperatorRightsBinds(t *testing.T) {
	t.Parallel()
	declare := []string{"$JS.API.STREAM.CREATE.>", "$JS.API.STREAM.UPDATE.>", "$JS.API.STREAM.DELETE.>",
		"$JS.API.CONSUMER.CREATE.>", "$JS.API.CONSUMER.DURABLE.CREATE.>", "$JS.API.CONSUMER.DELETE.>"}
	ns := natsauthtest.Start(t, natsauthtest.Server{
		JetStream: true,
		Users:     map[string]string{"operator": "op-pw", "worker": "w-pw"},
		Perms:     map[string]*server.Permissions{"worker": {Publish: &server.SubjectPermission{Allow: []string{">"}, Deny: declare}}},
	})
	cfg := config.Config{}.WithDefaults().NATS
	tenants := map[string]config.Tenant{"team-a": {Profiles: []string{"p"}, MaxConcurrent: 2}, "team-b": {Profiles: []string{"p"}}}
	dial := func(user, pw string) *nats.Conn {
		nc, err := queue.Connect(t.Context(), queue.ConnOptions{URL: ns.ClientURL(), User: user, Password: pw, Name: "bind-test"})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(nc.Close)
		return nc
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	worker := dial("worker", "w-pw")
	_, err := queue.Open(ctx, worker, cfg, tenants, slog.New(slog.DiscardHandler))
	if !errors.Is(err, queue.ErrNotReady) || !strings.Contains(err.Error(), "worker setup") {
		t.Fatalf("a worker that may not declare, before setup: %v; want ErrNotReady naming `worker setup`", err)
	}

	operator := dial("operator", "op-pw")
	admin, err := queue.NewAdmin(operator, cfg, tenants, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	if err := admin.Declare(ctx); err != nil {
		t.Fatalf("setup as the operator: %v", err)
	}

	w, err := queue.Open(ctx, worker, cfg, tenants, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatalf("a worker that may not declare, after setup: %v; want it bound", err)
	}
	if err := worker.LastError(); !errors.Is(err, nats.ErrPermissionViolation) {
		t.Errorf("the worker's connection saw no refusal (%v): the test's user may declare", err)
	}
	c, err := queue.NewClient(ctx, operator, cfg, "team-b")
	if err != nil {
		t.Fatal(err)
	}
	j := newJob(t)
	if _, err := c.Publish(ctx, j); err != nil {
		t.Fatal(err)
	}
	d := fetch(t, w, 10*time.Second)
	if d.Tenant != "team-b" || d.JobID != j.ID {
		t.Errorf("delivered %s of tenant %s, want %s of team-b", d.JobID, d.Tenant, j.ID)
	}
	if err := d.Ack(ctx); err != nil {
		t.Fatal(err)
	}
}
