//go:build integration

package tenancy

import (
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/boxcar-run/boxcar/internal/config"
	"github.com/boxcar-run/boxcar/internal/job"
	"github.com/boxcar-run/boxcar/internal/queue"
)

// TestRollupCannotPurgeAnotherTenantsKeys: an identity allowed to write only its own tenant's
// keys of a bucket publishes on one of them with the header Nats-Rollup: all, which the server
// checks against no subject and which, on a stream that allows roll-ups, purges the whole
// stream: every tenant's keys. Another tenant's key, written by its rightful writer, is still
// there afterwards.
func TestRollupCannotPurgeAnotherTenantsKeys(t *testing.T) {
	t.Parallel()
	d := deploy(t)
	// The shared approvals and cancel buckets are an older Boxcar's, as nats.go makes a bucket
	// (roll-ups allowed): `worker setup` keeps them for the older workers of an upgrade, and a
	// tenant's approver may still answer its own keys there, its submitter ask its own cancels.
	for _, older := range []string{config.Config{}.WithDefaults().NATS.ApprovalsBucket, queue.CancelBucket} {
		if _, err := d.connect(t, "operator").js.CreateKeyValue(t.Context(), jetstream.KeyValueConfig{Bucket: older}); err != nil {
			t.Fatal(err)
		}
	}
	cfg := setUp(t, d)
	idA, idB := job.NewID(), job.NewID()
	tests := []struct {
		name, bucket string
		// writer writes victim, a key of team-b; mallory, an identity of team-a, rolls up from own.
		writer, victim, mallory, own string
	}{
		{name: "team-a's submitter rolls up every tenant's cancel requests in the shared bucket", bucket: queue.CancelBucket,
			writer: "worker", victim: "team-b." + idB, mallory: "team-a-submitter", own: "team-a." + idA},
		{name: "team-a's approver rolls up every tenant's approval requests and answers in the shared bucket", bucket: cfg.ApprovalsBucket,
			writer: "worker", victim: "team-b." + idB + ".call_1", mallory: "team-a-approver", own: "team-a." + idA + ".call_1"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			if err := put(tt.bucket, tt.victim, `{}`)(ctx, d.connect(t, tt.writer)); err != nil {
				t.Fatalf("%s writes %s: %v", tt.writer, tt.victim, err)
			}
			m := nats.NewMsg("$KV." + tt.bucket + "." + tt.own)
			m.Header.Set("Nats-Rollup", "all")
			m.Data = []byte(`{}`)
			_, err := d.connect(t, tt.mallory).js.PublishMsg(ctx, m)
			t.Logf("%s's roll-up from its own key %s: %v", tt.mallory, tt.own, err)
			if err := get(tt.bucket, tt.victim)(ctx, d.connect(t, "operator")); err != nil {
				t.Errorf("team-b's key %s after %s's roll-up: %v; want it kept", tt.victim, tt.mallory, err)
			}
		})
	}
}
