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
	"github.com/boxcar-run/boxcar/internal/queue/queuetest"
)

// TestWorkerRefusedATenantFailsAtOnce: a worker whose tenants: lists team-b, with credentials
// generated before team-b was added, binds at its start. The server refuses it team-b's job
// stream, and the refusal shows on the connection alone: the start waited for the reply until
// its deadline, and said only that it passed. It fails at once now, ErrRefused, naming the
// tenant and what to do.
func TestWorkerRefusedATenantFailsAtOnce(t *testing.T) {
	t.Parallel()
	cfg := config.Config{}.WithDefaults().NATS
	teamB := queue.JobStream(cfg, "team-b")
	opts := &server.Options{ServerName: "boxcar-bind", Host: "127.0.0.1", Port: -1, NoSigs: true, NoLog: true,
		JetStream: true, StoreDir: t.TempDir(), JetStreamMaxStore: queuetest.MaxStore,
		Users: []*server.User{{Username: "op", Password: "op-pw"}, {Username: "worker", Password: "worker-pw", Permissions: &server.Permissions{
			Publish: &server.SubjectPermission{Allow: []string{">"}, Deny: []string{"$JS.API.STREAM.INFO." + teamB, "$JS.API.CONSUMER.*." + teamB + ".>"}}}}}}
	ns, err := server.NewServer(opts)
	if err != nil {
		t.Fatal(err)
	}
	go ns.Start()
	t.Cleanup(func() { ns.Shutdown(); ns.WaitForShutdown() })
	if !ns.ReadyForConnections(20 * time.Second) {
		t.Fatal("nats-server did not start")
	}
	conn := func(user string) *nats.Conn {
		nc, err := queue.Connect(t.Context(), queue.ConnOptions{URL: ns.ClientURL(), Name: "test-" + user, User: user, Password: user + "-pw"})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(nc.Close)
		return nc
	}
	tenants := map[string]config.Tenant{"team-a": {}, "team-b": {}}
	bundle{nc: conn("op"), cfg: cfg}.declare(t, tenants)
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	_, err = queue.NewConsumer(ctx, conn("worker"), cfg, tenants, slog.New(slog.DiscardHandler), nil)
	if !errors.Is(err, queue.ErrRefused) || ctx.Err() != nil || !strings.Contains(err.Error(), "team-b") {
		t.Fatalf("a worker's start refused team-b's stream: %v (deadline passed: %v); want ErrRefused at once, naming team-b", err, ctx.Err() != nil)
	}
}
