package queue

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
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
	kv jetstream.KeyValue
}

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
		kv, err = js.CreateOrUpdateKeyValue(ctx, jetstream.KeyValueConfig{
			Bucket: UsageBucket, Description: "Boxcar: model tokens each tenant spent per UTC day",
			History: 1, TTL: usageTTL, Storage: jetstream.FileStorage, Replicas: replicas,
		})
	case errors.Is(err, jetstream.ErrBucketNotFound):
		return nil, ErrNoUsage
	}
	if err != nil {
		return nil, fmt.Errorf("queue: bucket %s: %w", UsageBucket, err)
	}
	return &Usage{kv: kv}, nil
}

// ErrNoUsage marks a NATS where no worker has recorded usage yet.
var ErrNoUsage = errors.New("no usage recorded yet (no worker has created " + UsageBucket + ")")

// usageKey is the tenant's key for the UTC day of t.
func usageKey(tenant string, t time.Time) string {
	return tenant + "." + t.UTC().Format(time.DateOnly)
}

// Day returns what the tenant spent on the UTC day of t; zero when nothing yet.
func (u *Usage) Day(ctx context.Context, tenant string, t time.Time) (DayUsage, error) {
	e, err := u.kv.Get(ctx, usageKey(tenant, t))
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return DayUsage{}, nil
	}
	if err != nil {
		return DayUsage{}, fmt.Errorf("queue: read usage of %s: %w", tenant, err)
	}
	var d DayUsage
	if err := json.Unmarshal(e.Value(), &d); err != nil {
		return DayUsage{}, fmt.Errorf("queue: read usage of %s: %w", tenant, err)
	}
	return d, nil
}

// maxUsageTries bounds the compare-and-set rounds of one Add: each lost round means another
// worker added in between, which with a handful of workers resolves in a round or two.
const maxUsageTries = 32

// Add adds tokens to what the tenant spent on the UTC day of t, under compare-and-set so that
// no worker's addition is lost, records the budget it was spent against, and returns the day's
// new total.
func (u *Usage) Add(ctx context.Context, tenant string, t time.Time, tokens, dailyTokens int64) (int64, error) {
	key := usageKey(tenant, t)
	for range maxUsageTries {
		var (
			d   DayUsage
			rev uint64
		)
		e, err := u.kv.Get(ctx, key)
		switch {
		case errors.Is(err, jetstream.ErrKeyNotFound):
		case err != nil:
			return 0, fmt.Errorf("queue: add usage of %s: %w", tenant, err)
		default:
			rev = e.Revision()
			if err := json.Unmarshal(e.Value(), &d); err != nil {
				return 0, fmt.Errorf("queue: add usage of %s: %w", tenant, err)
			}
		}
		d.Tokens += tokens
		d.DailyTokens, d.UpdatedAt = dailyTokens, time.Now().UTC()
		if rev == 0 {
			_, err = u.kv.Create(ctx, key, mustJSON(d))
		} else {
			_, err = u.kv.Update(ctx, key, mustJSON(d), rev)
		}
		if err == nil {
			return d.Tokens, nil
		}
		if !errors.Is(err, jetstream.ErrKeyExists) && !isWrongLastSequence(err) {
			return 0, fmt.Errorf("queue: add usage of %s: %w", tenant, err)
		}
	}
	return 0, fmt.Errorf("queue: add usage of %s: %d writers in a row got there first", tenant, maxUsageTries)
}
