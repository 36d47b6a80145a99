package queue

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// UsageBucket names the key-value buckets of what each tenant's jobs spent on the model per UTC
// day, under TENANT.YYYY-MM-DD: a tenant's is UsageBucket_TENANT (usageBucket), which workers
// add to after every model answer and read before every model request, and which the tenant's
// submitter reads. The bucket named UsageBucket itself is where an older Boxcar kept every
// tenant's days, and its info, which a submitter was granted to read its own, listed every
// tenant's keys: no Boxcar of this version makes or writes it, and while an upgrade runs, what
// older workers still add there is read by a direct get of the tenant's day alone and added to
// the tenant's bucket's (tenantBuckets), so that no day's spending resets or doubles.
const UsageBucket = "BOXCAR_USAGE"

// usageBucket is tenant's usage bucket, UsageBucket_TENANT.
func usageBucket(tenant string) string { return tenantBucket(UsageBucket, tenant) }

// UsageBucketOf is the name of tenant's usage bucket, for what names it to an operator.
func UsageBucketOf(tenant string) string { return usageBucket(tenant) }

// usageTTL keeps a day's entry a week after its last change: long enough for `submit status`
// to show yesterday's, short enough that the bucket stays small.
const usageTTL = 8 * 24 * time.Hour

// DayUsage is one tenant's spending on one UTC day.
type DayUsage struct {
	Tokens int64 `json:"tokens"`
	// DailyTokens is the tenant's budget as the worker that wrote last saw it; 0 is unlimited.
	DailyTokens int64     `json:"daily_tokens,omitempty"`
	UpdatedAt   time.Time `json:"updated_at"`
}

// Usage is a handle on the usage buckets of some tenants (a worker's, a submitter's own).
type Usage struct {
	js      jetstream.JetStream
	buckets *tenantBuckets
	clock   string // the stream whose info Now reads the server's clock from

	mu     sync.Mutex
	offset time.Duration // the server's clock less the worker's, as last read
	read   time.Time     // when offset was read (the worker's clock); zero: never
}

// serverClockFor is how long Now trusts a reading of the server's clock: clocks drift by
// milliseconds a day, so one look a minute holds the day to the server's without a round trip
// before every model request and after every answer.
const serverClockFor = time.Minute

// OpenUsage binds the usage buckets of tenants (at least one), which `worker setup` (or a
// worker that may declare) made; ErrNotReady names the first missing. A worker (worker set)
// looks the shared bucket up once, here: where there is none (a deployment that began with
// this version, or one whose upgrade ended and removed it), reading a day before each model
// request asks nothing more than the tenant's bucket. A submitter, which may not look it up,
// learns that from its first direct get there.
func OpenUsage(ctx context.Context, nc *nats.Conn, tenants []string, worker bool) (*Usage, error) {
	if len(tenants) == 0 {
		return nil, errors.New("queue: open usage: no tenant")
	}
	js, err := newJetStream(nc)
	if err != nil {
		return nil, err
	}
	u := &Usage{js: js, buckets: newTenantBuckets(js, UsageBucket, "usage"), clock: statusStream(usageBucket(tenants[0]))}
	if worker {
		if err := u.buckets.learnShared(ctx); err != nil {
			return nil, err
		}
	}
	for _, tenant := range tenants {
		if _, err := u.buckets.of(ctx, tenant); err != nil {
			return nil, err
		}
	}
	return u, nil
}

// Now is the NATS server's clock, as it stamps its answer to a look at the bucket: the one
// clock every worker and submitter of a fleet shares, so that all of them change a tenant's
// budget day at the same moment whatever their own clocks say (docs/operations.md#clocks). The
// difference from the worker's clock is read again once serverClockFor has passed.
func (u *Usage) Now(ctx context.Context) (time.Time, error) {
	u.mu.Lock()
	if !u.read.IsZero() && time.Since(u.read) < serverClockFor {
		defer u.mu.Unlock()
		return time.Now().Add(u.offset).UTC(), nil
	}
	u.mu.Unlock()
	sent := time.Now()
	stream, err := u.js.Stream(ctx, u.clock)
	if err != nil {
		return time.Time{}, fmt.Errorf("queue: the server's time from %s: %w", u.clock, err)
	}
	info := stream.CachedInfo()
	if info.TimeStamp.IsZero() { // a server before 2.10 does not say
		return time.Time{}, fmt.Errorf("queue: the server's time from %s: the server does not stamp its stream info", u.clock)
	}
	got := time.Now()
	u.mu.Lock()
	defer u.mu.Unlock()
	u.offset = info.TimeStamp.Sub(sent.Add(got.Sub(sent) / 2)) // stamped half way, give or take
	u.read = got
	return info.TimeStamp.UTC(), nil
}

// usageKey is the tenant's key for the UTC day of t.
func usageKey(tenant string, t time.Time) string {
	return tenant + "." + t.UTC().Format(time.DateOnly)
}

// Day returns what the tenant spent on the UTC day of t; zero when nothing yet. During an
// upgrade that is the sum of the tenant's bucket and what older workers added to the day's key
// in the shared bucket.
func (u *Usage) Day(ctx context.Context, tenant string, t time.Time) (DayUsage, error) {
	key := usageKey(tenant, t)
	kv, err := u.buckets.of(ctx, tenant)
	if err != nil {
		return DayUsage{}, fmt.Errorf("queue: usage of %s: %w", tenant, err)
	}
	d, _, err := read[DayUsage](ctx, kv, key)
	if err != nil {
		return DayUsage{}, fmt.Errorf("queue: usage of %s: %w", tenant, err)
	}
	return u.withShared(ctx, key, d)
}

// withShared is d, a day of a tenant's bucket, with what older workers of an upgrade added
// to the day's key in the shared bucket; its budget is the one written last. A worker that
// learned there is no shared bucket asks nothing.
func (u *Usage) withShared(ctx context.Context, key string, d DayUsage) (DayUsage, error) {
	old, _, err := read[DayUsage](ctx, u.buckets.shared, key)
	if err != nil {
		return DayUsage{}, fmt.Errorf("queue: usage %s that older workers counted: %w", key, err)
	}
	if old.UpdatedAt.After(d.UpdatedAt) {
		d.DailyTokens, d.UpdatedAt = old.DailyTokens, old.UpdatedAt
	}
	d.Tokens += old.Tokens
	return d, nil
}

// Add adds tokens to what the tenant spent on the UTC day of t in the tenant's bucket, under
// compare-and-set so that no worker's addition is lost, records the budget it was spent
// against, and returns the day's new total (with the shared bucket's, as Day). Writers that
// keep colliding (many workers' answers at once) back off, jittered, for up to about two
// seconds in all before the addition is given up.
func (u *Usage) Add(ctx context.Context, tenant string, t time.Time, tokens, dailyTokens int64) (int64, error) {
	key := usageKey(tenant, t)
	kv, err := u.buckets.of(ctx, tenant)
	if err != nil {
		return 0, fmt.Errorf("queue: add usage of %s: %w", tenant, err)
	}
	pause := 2 * time.Millisecond
	for {
		d, _, err := update(ctx, kv, key, guess[DayUsage]{}, func(d *DayUsage, _ uint64) (bool, error) {
			d.Tokens += tokens
			d.DailyTokens, d.UpdatedAt = dailyTokens, time.Now().UTC()
			return true, nil
		})
		if err == nil {
			total, err := u.withShared(ctx, key, d)
			if err != nil {
				return 0, fmt.Errorf("queue: added %d tokens to %s, but not the day's total: %w", tokens, tenant, err)
			}
			return total.Tokens, nil
		}
		if !errors.Is(err, errContention) || pause > time.Second {
			return 0, fmt.Errorf("queue: add usage of %s: %w", tenant, err)
		}
		select {
		case <-ctx.Done():
			return 0, fmt.Errorf("queue: add usage of %s: %w", tenant, ctx.Err())
		case <-time.After(pause/2 + rand.N(pause)):
		}
		pause *= 2
	}
}

// usageBucketConfig is tenant's usage bucket as the operator declares it; with tenant "", the
// shared bucket an older Boxcar made.
func usageBucketConfig(replicas int, tenant string) jetstream.KeyValueConfig {
	name, what := usageBucket(tenant), "Boxcar: model tokens tenant "+tenant+" spent per UTC day"
	if tenant == "" {
		name, what = UsageBucket, "Boxcar: model tokens each tenant spent per UTC day, added by workers before each tenant had a bucket of its own"
	}
	return jetstream.KeyValueConfig{
		Bucket: name, Description: what,
		History: 1, TTL: usageTTL, Storage: jetstream.FileStorage, Replicas: replicas,
	}
}

// declareUsage creates or updates each tenant's usage bucket, and updates the shared one where
// an older Boxcar made it (its workers add to it during an upgrade), never making it. Nothing
// moves: a day's spending is the sum of both buckets (Usage.Day), so a day copied into the
// tenant's would count twice, and one moved would race an older worker's next addition; the
// shared bucket's days expire usageTTL after their last addition.
func (a *Admin) declareUsage(ctx context.Context, tenants []string) error {
	for _, tenant := range tenants {
		if _, err := declareBucket(ctx, a.js, usageBucketConfig(a.cfg.Replicas, tenant)); err != nil {
			return fmt.Errorf("queue: set up usage bucket %s of tenant %s: %w", usageBucket(tenant), tenant, err)
		}
	}
	switch _, err := a.js.Stream(ctx, statusStream(UsageBucket)); {
	case errors.Is(err, jetstream.ErrStreamNotFound):
		return nil
	case err != nil:
		return fmt.Errorf("queue: look up the shared usage bucket %s: %w", UsageBucket, err)
	}
	if err := updateBucket(ctx, a.js, usageBucketConfig(a.cfg.Replicas, "")); err != nil {
		return fmt.Errorf("queue: update the shared usage bucket %s: %w", UsageBucket, err)
	}
	return nil
}
