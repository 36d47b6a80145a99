package queue

import (
	"context"
	"errors"
	"fmt"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/boxcar-run/boxcar/internal/config"
)

// Each tenant's statuses are in a bucket of its own, <status_bucket>_T (tenantbuckets.go). The
// bucket named status_bucket itself, where an older Boxcar's workers wrote every tenant's
// statuses, is no tenant's any more: `worker setup` copies the ended jobs' statuses from it
// into their tenants' buckets (moveShared), and while an upgrade runs, what it still holds of
// a tenant's job (one an older worker runs) is read by a direct get of the job's key alone.

// statusBucket is tenant's status bucket: <status_bucket>_T.
func statusBucket(cfg config.NATS, tenant string) string {
	return tenantBucket(cfg.StatusBucket, tenant)
}

// StatusBucket is the name of tenant's status bucket, for what names it to an operator.
func StatusBucket(cfg config.NATS, tenant string) string { return statusBucket(cfg, tenant) }

// newStatusBuckets is a worker's status buckets. It reads the shared bucket only when there is
// one, which no Boxcar of this version makes: a deployment that began with it asks nothing
// more for a job's first status than its tenant's bucket.
func newStatusBuckets(ctx context.Context, js jetstream.JetStream, cfg config.NATS) (*tenantBuckets, error) {
	b := newTenantBuckets(js, cfg.StatusBucket, "status")
	if err := b.learnShared(ctx); err != nil {
		return nil, err
	}
	return b, nil
}

// declareStatuses creates or updates each tenant's status bucket, and the shared one where an
// older Boxcar made it (its workers bind it during an upgrade; a deployment that began with
// this version has none), then copies the shared bucket's ended statuses (moveStatuses).
func (a *Admin) declareStatuses(ctx context.Context, tenants []string) error {
	for _, tenant := range tenants {
		want := statusBucketConfig(a.cfg, tenant)
		if _, err := setUpStatus(ctx, a.js, want, a.worker, a.log); err != nil {
			return fmt.Errorf("queue: set up status bucket %s of tenant %s: %w", want.Bucket, tenant, err)
		}
	}
	switch _, err := lookupShared(ctx, a.js, statusStream(a.cfg.StatusBucket)); {
	case errors.Is(err, jetstream.ErrStreamNotFound):
		return nil
	case err != nil:
		return fmt.Errorf("queue: look up the shared status bucket %s: %w", a.cfg.StatusBucket, err)
	}
	shared := statusBucketConfig(a.cfg, "")
	shared.Bucket, shared.Description = a.cfg.StatusBucket, "Boxcar job status by tenant.job, written by workers before each tenant had a bucket of its own"
	if err := updateStatusBucket(ctx, a.js, shared, a.worker, a.log); err != nil {
		return fmt.Errorf("queue: update the shared status bucket %s: %w", a.cfg.StatusBucket, err)
	}
	// A job that has not ended stays: an older worker may still write its end there.
	return a.moveShared(ctx, newTenantBuckets(a.js, a.cfg.StatusBucket, "status"), tenants, func(_ string, data []byte) bool {
		st, err := decodeStatus(data)
		return err == nil && st.State.Terminal()
	})
}
