package queue_test

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/boxcar-run/boxcar/internal/config"
	"github.com/boxcar-run/boxcar/internal/queue"
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
	conn := serverDenyingWorker(t, "$JS.API.STREAM.INFO."+teamB, "$JS.API.CONSUMER.*."+teamB+".>")
	tenants := map[string]config.Tenant{"team-a": {}, "team-b": {}}
	bundle{nc: conn("op"), cfg: cfg}.declare(t, tenants)
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	_, err := queue.NewConsumer(ctx, conn("worker"), cfg, tenants, slog.New(slog.DiscardHandler), nil)
	if !errors.Is(err, queue.ErrRefused) || ctx.Err() != nil || !strings.Contains(err.Error(), "team-b") {
		t.Fatalf("a worker's start refused team-b's stream: %v (deadline passed: %v); want ErrRefused at once, naming team-b", err, ctx.Err() != nil)
	}
}
