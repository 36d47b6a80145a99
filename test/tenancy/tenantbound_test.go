//go:build integration

package tenancy

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

// TestTenantsOwnBoundIsNamedToItsSubmitter: with the identities `worker nats-config` makes,
// team-a's submitter, which may look up its own job stream only, is refused its third job
// past team-a's max_queued of 2 with a queue.ErrFull naming tenants.team-a.max_queued, the
// setting the operator raises, not nats.job_max_msgs, which team-b's queue still has room in.
func TestTenantsOwnBoundIsNamedToItsSubmitter(t *testing.T) {
	t.Parallel()
	d := deploy(t)
	cfg := config.Config{}.WithDefaults().NATS
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	tenants := map[string]config.Tenant{"team-a": {Profiles: []string{"p"}, MaxQueued: 2}, "team-b": twoTenants["team-b"]}
	admin, err := queue.NewAdmin(d.connect(t, "operator").nc, cfg, tenants, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	if err := admin.Declare(ctx); err != nil {
		t.Fatalf("worker setup: %v", err)
	}
	sub := d.connect(t, "team-a-submitter")
	a, err := queue.NewClient(ctx, sub.nc, cfg, "team-a")
	if err != nil {
		t.Fatal(err)
	}
	err = fill(ctx, a, sub, "small", false)
	if !errors.Is(err, queue.ErrFull) || !strings.Contains(err.Error(), " tenants.team-a.max_queued ") {
		t.Fatalf("team-a fills its queue: %v; want queue.ErrFull naming tenants.team-a.max_queued", err)
	}
	s, err := d.connect(t, "operator").js.Stream(ctx, queue.JobStream(cfg, "team-a"))
	if err != nil {
		t.Fatal(err)
	}
	if n := s.CachedInfo().State.Msgs; n != 2 {
		t.Errorf("team-a's job stream holds %d jobs; want its max_queued, 2", n)
	}
}
