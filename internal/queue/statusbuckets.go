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
// into their tenants' buckets (moveStatuses), and while an upgrade runs, what it still holds of
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

// moveStatuses copies, for each tenant, the statuses of its ended jobs from the shared status
// bucket an older Boxcar's workers wrote into the tenant's own, where its tenant lists them
// (`submit list`); a key the tenant's bucket holds already is left. A job that has not ended
// stays where it is: an older worker may still write its end there, which a copy made now
// would hide; a reader finds it there by its key until a worker of this version writes it
// (adopt), or the next `worker setup` copies its end. A copy expires status_ttl after it was
// made. Nothing is removed from the shared bucket, which older workers still write during an
// upgrade.
func (a *Admin) moveStatuses(ctx context.Context, tenants []string) error {
	shared, err := a.js.KeyValue(ctx, a.cfg.StatusBucket)
	if errors.Is(err, jetstream.ErrBucketNotFound) {
		return nil // no older Boxcar wrote here
	}
	if err != nil {
		return fmt.Errorf("queue: look up the shared status bucket %s: %w", a.cfg.StatusBucket, err)
	}
	for _, tenant := range tenants {
		n, err := a.moveTenantStatuses(ctx, shared, tenant)
		if err != nil {
			return err
		}
		if n > 0 {
			a.log.InfoContext(ctx, "copied the statuses of a tenant's ended jobs from the shared status bucket into the tenant's own",
				"tenant", tenant, "from", a.cfg.StatusBucket, "to", statusBucket(a.cfg, tenant), "statuses", n)
		}
	}
	return nil
}

// moveTenantStatuses is moveStatuses for one tenant; it returns how many statuses it copied.
func (a *Admin) moveTenantStatuses(ctx context.Context, shared jetstream.KeyValue, tenant string) (int, error) {
	name := statusBucket(a.cfg, tenant)
	kv, err := a.js.KeyValue(ctx, name)
	if err != nil {
		return 0, fmt.Errorf("queue: look up status bucket %s: %w", name, err)
	}
	have, err := listKeys(ctx, a.js, name, tenant+".*")
	if err != nil {
		return 0, fmt.Errorf("queue: %w", err)
	}
	held := map[string]bool{}
	for _, k := range have {
		held[k] = true
	}
	old, err := listKeys(ctx, a.js, a.cfg.StatusBucket, tenant+".*")
	if err != nil {
		return 0, fmt.Errorf("queue: %w", err)
	}
	var missing []string
	for _, k := range old {
		if !held[k] {
			missing = append(missing, k)
		}
	}
	n := 0
	for i, r := range getEach(ctx, shared, missing) {
		if r.err != nil {
			continue // deleted, purged or expired since it was listed; a timeout: the next setup
		}
		st, err := decodeStatus(r.entry.Value())
		if err != nil || !st.State.Terminal() {
			continue
		}
		_, err = kv.Create(ctx, missing[i], r.entry.Value())
		switch {
		case err == nil:
			n++
		case !errors.Is(err, jetstream.ErrKeyExists):
			return n, fmt.Errorf("queue: copy the status %s from %s into %s: %w", missing[i], a.cfg.StatusBucket, name, err)
		}
	}
	return n, nil
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
	switch _, err := a.js.Stream(ctx, statusStream(a.cfg.StatusBucket)); {
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
	return a.moveStatuses(ctx, tenants)
}
