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

// UsageBucket is the key-value bucket of what each tenant's jobs spent on the model per UTC
// day, under TENANT.YYYY-MM-DD: workers add to it after every model answer and read it before
// every model request; a submitter of the tenant reads its own keys.
const UsageBucket = "BOXCAR_USAGE"

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

// Usage is a handle on UsageBucket.
type Usage struct {
	kv     jetstream.KeyValue
	stream jetstream.Stream

	mu     sync.Mutex
	offset time.Duration // the server's clock less the worker's, as last read
	read   time.Time     // when offset was read (the worker's clock); zero: never
}

// serverClockFor is how long Now trusts a reading of the server's clock: clocks drift by
// milliseconds a day, so one look a minute holds the day to the server's without a round trip
// before every model request and after every answer.
const serverClockFor = time.Minute

// OpenUsage binds to UsageBucket, creating it when create is set (a worker, which declares
// what it needs today) and it is missing. A client that does not create gets ErrNoUsage when
// no worker has made it yet.
func OpenUsage(ctx context.Context, nc *nats.Conn, replicas int, create bool) (*Usage, error) {
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, fmt.Errorf("queue: jetstream: %w", err)
	}
	kv, err := js.KeyValue(ctx, UsageBucket)
	switch {
	case errors.Is(err, jetstream.ErrBucketNotFound) && create:
		kv, err = declareBucket(ctx, js, usageBucketConfig(replicas))
	case errors.Is(err, jetstream.ErrBucketNotFound):
		return nil, ErrNoUsage
	}
	if err != nil {
		return nil, fmt.Errorf("queue: bucket %s: %w", UsageBucket, err)
	}
	stream, err := js.Stream(ctx, "KV_"+UsageBucket)
	if err != nil {
		return nil, fmt.Errorf("queue: bucket %s: %w", UsageBucket, err)
	}
	return &Usage{kv: kv, stream: stream}, nil
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
	info, err := u.stream.Info(ctx)
	if err != nil {
		return time.Time{}, fmt.Errorf("queue: the server's time from %s: %w", UsageBucket, err)
	}
	if info.TimeStamp.IsZero() { // a server before 2.10 does not say
		return time.Time{}, fmt.Errorf("queue: the server's time from %s: the server does not stamp its stream info", UsageBucket)
	}
	got := time.Now()
	u.mu.Lock()
	defer u.mu.Unlock()
	u.offset = info.TimeStamp.Sub(sent.Add(got.Sub(sent) / 2)) // stamped half way, give or take
	u.read = got
	return info.TimeStamp.UTC(), nil
}

// ErrNoUsage marks a NATS where no worker has recorded usage yet.
var ErrNoUsage = errors.New("no usage recorded yet (no worker has created " + UsageBucket + ")")

// usageKey is the tenant's key for the UTC day of t.
func usageKey(tenant string, t time.Time) string {
	return tenant + "." + t.UTC().Format(time.DateOnly)
}

// Day returns what the tenant spent on the UTC day of t; zero when nothing yet.
func (u *Usage) Day(ctx context.Context, tenant string, t time.Time) (DayUsage, error) {
	d, _, err := read[DayUsage](ctx, u.kv, usageKey(tenant, t))
	if err != nil {
		return DayUsage{}, fmt.Errorf("queue: usage of %s: %w", tenant, err)
	}
	return d, nil
}

// Add adds tokens to what the tenant spent on the UTC day of t, under compare-and-set so that
// no worker's addition is lost, records the budget it was spent against, and returns the day's
// new total. Writers that keep colliding (many workers' answers at once) back off, jittered,
// for up to about two seconds in all before the addition is given up.
func (u *Usage) Add(ctx context.Context, tenant string, t time.Time, tokens, dailyTokens int64) (int64, error) {
	key := usageKey(tenant, t)
	pause := 2 * time.Millisecond
	for {
		d, _, err := update(ctx, u.kv, key, guess[DayUsage]{}, func(d *DayUsage, _ uint64) (bool, error) {
			d.Tokens += tokens
			d.DailyTokens, d.UpdatedAt = dailyTokens, time.Now().UTC()
			return true, nil
		})
		if err == nil {
			return d.Tokens, nil
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

// usageBucketConfig is UsageBucket as the operator declares it.
func usageBucketConfig(replicas int) jetstream.KeyValueConfig {
	return jetstream.KeyValueConfig{
		Bucket: UsageBucket, Description: "Boxcar: model tokens each tenant spent per UTC day",
		History: 1, TTL: usageTTL, Storage: jetstream.FileStorage, Replicas: replicas,
	}
}
