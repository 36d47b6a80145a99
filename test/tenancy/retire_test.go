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

// TestOperatorRetiresATenant: `worker setup` with the operator's identity `worker nats-config`
// makes (the chart's setup Job's), run with a config that no longer lists team-b, dead-letters
// team-b's queued job. The operator could not publish a dead letter: each publish, refused,
// waited for an answer until setup's deadline, setup failed, and the job, its status already
// written dead, stayed without its letter for a worker of the old config to drop. During an
// upgrade setup writes the job's end in the shared status bucket too, where older workers
// claim: that write was refused as well.
func TestOperatorRetiresATenant(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name         string
		sharedStatus bool // an older Boxcar's shared status bucket is there (an upgrade)
	}{
		{"tenants' status buckets alone", false},
		{"shared status bucket of an upgrade", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			d := deploy(t)
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			op := d.connect(t, "operator")
			cfg := config.Config{}.WithDefaults().NATS
			if tc.sharedStatus {
				if _, err := op.js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: cfg.StatusBucket}); err != nil {
					t.Fatal(err)
				}
			}
			setUpWith(t, d, cfg)
			c, err := queue.NewClient(ctx, d.connect(t, "team-b-submitter").nc, cfg, "team-b")
			if err != nil {
				t.Fatal(err)
			}
			j := job.Job{Version: job.Version, ID: job.NewID(), Profile: "p", Task: "t", SubmittedAt: time.Now().UTC()}
			if _, err := c.Publish(ctx, j); err != nil {
				t.Fatal(err)
			}
			admin, err := queue.NewAdmin(op.nc, cfg, map[string]config.Tenant{"team-a": twoTenants["team-a"]}, slog.New(slog.DiscardHandler))
			if err != nil {
				t.Fatal(err)
			}
			setupCtx, setupCancel := context.WithTimeout(ctx, time.Minute)
			defer setupCancel()
			if err := admin.Declare(setupCtx); err != nil {
				t.Errorf("worker setup retiring team-b: %v", err)
			}
			if _, err := queue.DeadLetterOf(ctx, op.nc, cfg, queue.Ref{Tenant: "team-b", ID: j.ID}); err != nil {
				t.Errorf("team-b's queued job after setup retired team-b: %v; want its unknown_tenant letter", err)
			}
		})
	}
}
