package queue_test

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/boxcar-run/boxcar/internal/config"
	"github.com/boxcar-run/boxcar/internal/queue"
)

// setUpUsage declares the layout of tenants as `worker setup` does, their usage buckets with it.
func setUpUsage(ctx context.Context, t *testing.T, nc *nats.Conn, tenants ...string) {
	t.Helper()
	cfg := map[string]config.Tenant{}
	for _, tn := range tenants {
		cfg[tn] = config.Tenant{}
	}
	admin, err := queue.NewAdmin(nc, config.Config{}.WithDefaults().NATS, cfg, slog.New(slog.DiscardHandler))
	if err == nil {
		err = admin.Declare(ctx)
	}
	if err != nil {
		t.Fatalf("worker setup: %v", err)
	}
}

// TestUsageAddsUp: workers adding a tenant's tokens at the same time lose none of them (each
// addition is a compare-and-set), and each tenant and UTC day has its own count, in the
// tenant's own bucket.
func TestUsageAddsUp(t *testing.T) {
	t.Parallel()
	nc := connect(t, false)
	ctx := t.Context()
	if _, err := queue.OpenUsage(ctx, nc, []string{"team-a"}, false); !errors.Is(err, queue.ErrNotReady) {
		t.Fatalf("a client before any setup: %v, want ErrNotReady", err)
	}
	setUpUsage(ctx, t, nc, "team-a", "team-b", "team-c")
	workers := make([]*queue.Usage, 4)
	for i := range workers {
		wc, err := queue.Connect(ctx, queue.ConnOptions{URL: nc.ConnectedUrl(), Name: "worker"})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(wc.Close)
		u, err := queue.OpenUsage(ctx, wc, []string{"team-a", "team-b"}, true)
		if err != nil {
			t.Fatal(err)
		}
		workers[i] = u
	}
	day := time.Date(2026, 12, 4, 23, 59, 0, 0, time.UTC)
	var wg sync.WaitGroup
	for _, u := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 25 {
				if _, err := u.Add(ctx, "team-a", day, 7, 1000); err != nil {
					t.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	if _, err := workers[0].Add(ctx, "team-b", day, 5, 0); err != nil {
		t.Fatal(err)
	}
	if _, err := workers[0].Add(ctx, "team-a", day.Add(time.Minute), 3, 1000); err != nil {
		t.Fatal(err)
	}
	client, err := queue.OpenUsage(ctx, nc, []string{"team-a", "team-b", "team-c"}, false)
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name   string
		tenant string
		at     time.Time
		want   queue.DayUsage
	}{
		{"every addition counted", "team-a", day, queue.DayUsage{Tokens: 4 * 25 * 7, DailyTokens: 1000}},
		{"the same day in another zone", "team-a", day.In(time.FixedZone("UTC-5", -5*3600)), queue.DayUsage{Tokens: 700, DailyTokens: 1000}},
		{"the next UTC day", "team-a", day.Add(time.Minute), queue.DayUsage{Tokens: 3, DailyTokens: 1000}},
		{"another tenant", "team-b", day, queue.DayUsage{Tokens: 5}},
		{"nothing spent", "team-c", day, queue.DayUsage{}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := client.Day(ctx, tt.tenant, tt.at)
			if err != nil {
				t.Fatal(err)
			}
			if got.Tokens != tt.want.Tokens || got.DailyTokens != tt.want.DailyTokens {
				t.Errorf("Day(%s, %s) = %+v, want %+v", tt.tenant, tt.at, got, tt.want)
			}
		})
	}
}

// TestUsageNowIsTheServers: Usage.Now reads the NATS server's clock (the embedded server shares
// the test's, so its time falls between two readings of the test's own).
func TestUsageNowIsTheServers(t *testing.T) {
	t.Parallel()
	nc := connect(t, false)
	setUpUsage(t.Context(), t, nc, "team-a")
	u, err := queue.OpenUsage(t.Context(), nc, []string{"team-a"}, true)
	if err != nil {
		t.Fatal(err)
	}
	before := time.Now().UTC().Truncate(time.Microsecond)
	now, err := u.Now(t.Context())
	after := time.Now().UTC()
	if err != nil {
		t.Fatal(err)
	}
	if now.Before(before) || now.After(after) || now.Location() != time.UTC {
		t.Errorf("Now() = %s, want the server's UTC time between %s and %s", now, before, after)
	}
}

// TestUsageNowReadsTheServerOncePerInterval: the server's clock is read once, not on every
// call (the runner asks before each model request and after each answer), and the calls in
// between follow it.
func TestUsageNowReadsTheServerOncePerInterval(t *testing.T) {
	t.Parallel()
	nc := connect(t, false)
	setUpUsage(t.Context(), t, nc, "team-a")
	u, err := queue.OpenUsage(t.Context(), nc, []string{"team-a"}, true)
	if err != nil {
		t.Fatal(err)
	}
	looks, err := nc.SubscribeSync("$JS.API.STREAM.INFO.KV_" + queue.UsageBucketOf("team-a"))
	if err != nil {
		t.Fatal(err)
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	first, err := u.Now(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	for range 10 {
		now, err := u.Now(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		if now.Before(first.Add(-time.Second)) || now.Location() != time.UTC {
			t.Fatalf("Now() = %s after %s: not the server's clock carried on", now, first)
		}
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	if n, _, _ := looks.Pending(); n != 1 {
		t.Errorf("11 calls of Now looked at the server %d times, want 1", n)
	}
}

// TestUsageOfAnUpgradeAddsUp is a rolling upgrade from one usage bucket for every tenant: older
// workers go on adding to the day's key in BOXCAR_USAGE, workers of this version add to the
// tenant's BOXCAR_USAGE_TENANT, and the day a worker holds the budget to and a submitter shows
// is the sum of both, so that the tenant's budget neither starts again at the upgrade nor
// counts a token twice, however often `worker setup` runs; another tenant's day is its own.
func TestUsageOfAnUpgradeAddsUp(t *testing.T) {
	t.Parallel()
	u := newUpgrade(t, false)
	nc, ctx := u.nc, u.ctx
	shared := u.olderBucket(t, queue.UsageBucket, 1)
	day := time.Date(2026, 12, 4, 15, 0, 0, 0, time.UTC)
	older := func(tenant string, tokens, budget int64) { // what an older worker's addition leaves
		t.Helper()
		data, err := json.Marshal(queue.DayUsage{Tokens: tokens, DailyTokens: budget, UpdatedAt: time.Now().UTC()})
		if err == nil {
			_, err = shared.Put(ctx, tenant+"."+day.Format(time.DateOnly), data)
		}
		if err != nil {
			t.Fatal(err)
		}
	}
	older("team-a", 300, 1000)
	older("team-b", 7, 0)
	setUpUsage(ctx, t, nc, "team-a", "team-b")
	worker, err := queue.OpenUsage(ctx, nc, []string{"team-a", "team-b"}, true)
	if err != nil {
		t.Fatal(err)
	}
	submitter, err := queue.OpenUsage(ctx, nc, []string{"team-a"}, false)
	if err != nil {
		t.Fatal(err)
	}
	if total, err := worker.Add(ctx, "team-a", day, 50, 2000); err != nil || total != 350 {
		t.Fatalf("Add(team-a, 50) = %d, %v; want 350, the older workers' 300 and 50", total, err)
	}
	older("team-a", 400, 1000) // an older worker adds 100 more
	steps := []struct {
		name   string
		u      *queue.Usage
		tenant string
		setup  bool // `worker setup` runs again first
		want   queue.DayUsage
	}{
		{"the worker's day: both, the budget written last", worker, "team-a", false, queue.DayUsage{Tokens: 450, DailyTokens: 1000}},
		{"the submitter's day", submitter, "team-a", false, queue.DayUsage{Tokens: 450, DailyTokens: 1000}},
		{"after setup again: nothing counted twice", worker, "team-a", true, queue.DayUsage{Tokens: 450, DailyTokens: 1000}},
		{"another tenant's day: its own older count alone", worker, "team-b", false, queue.DayUsage{Tokens: 7}},
	}
	for _, s := range steps {
		if s.setup {
			setUpUsage(ctx, t, nc, "team-a", "team-b")
		}
		got, err := s.u.Day(ctx, s.tenant, day)
		if err != nil || got.Tokens != s.want.Tokens || got.DailyTokens != s.want.DailyTokens {
			t.Errorf("%s: Day(%s) = %+v, %v; want %+v", s.name, s.tenant, got, err, s.want)
		}
	}
}

// TestUsageReadsNoSharedBucketWhereNone: in a deployment that began with this version there is
// no shared usage bucket, setup makes none, and a worker, which reads a tenant's day before each
// model request, asks nothing of one.
func TestUsageReadsNoSharedBucketWhereNone(t *testing.T) {
	t.Parallel()
	nc := connect(t, false)
	ctx := t.Context()
	setUpUsage(ctx, t, nc, "team-a")
	if _, err := jetStream(t, nc).KeyValue(ctx, queue.UsageBucket); !errors.Is(err, jetstream.ErrBucketNotFound) {
		t.Fatalf("the shared bucket after setup: %v, want none", err)
	}
	u, err := queue.OpenUsage(ctx, nc, []string{"team-a"}, true)
	if err != nil {
		t.Fatal(err)
	}
	asks, err := nc.SubscribeSync("$JS.API.DIRECT.GET.KV_" + queue.UsageBucket + ".>")
	if err != nil {
		t.Fatal(err)
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	for range 5 {
		if _, err := u.Add(ctx, "team-a", time.Now(), 3, 100); err != nil {
			t.Fatal(err)
		}
		if _, err := u.Day(ctx, "team-a", time.Now()); err != nil {
			t.Fatal(err)
		}
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	if n, _, _ := asks.Pending(); n != 0 {
		t.Errorf("5 additions and reads asked the shared bucket %d times, want none", n)
	}
}

// TestUsageOfAnUpgradeOutlivesASharedBucketGone: during an upgrade the shared usage bucket
// stops answering a while (a server restarting, its replicas moving; here its stream removed
// and made again) and then answers again. A worker that read a day meanwhile counts the older
// workers' tokens again once the shared bucket is back: nobody answering is no bucket for
// SharedRelook, not for the rest of the worker's life. Before, the worker's day was 50, the
// older workers' 300 ignored until it restarted, and a budget allowed them again.
func TestUsageOfAnUpgradeOutlivesASharedBucketGone(t *testing.T) {
	t.Parallel()
	u := newUpgrade(t, false)
	nc, js, ctx := u.nc, u.js, u.ctx
	day := time.Date(2026, 12, 4, 15, 0, 0, 0, time.UTC)
	olderBucket := func() { // what older workers' additions leave in the shared bucket
		t.Helper()
		shared := u.olderBucket(t, queue.UsageBucket, 1)
		if _, err := shared.Put(ctx, "team-a."+day.Format(time.DateOnly), mustMarshal(t, queue.DayUsage{Tokens: 300})); err != nil {
			t.Fatal(err)
		}
	}
	olderBucket()
	setUpUsage(ctx, t, nc, "team-a")
	worker, err := queue.OpenUsage(ctx, nc, []string{"team-a"}, true)
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	now := time.Now()
	worker.SetSharedClock(func() time.Time { mu.Lock(); defer mu.Unlock(); return now })
	if total, err := worker.Add(ctx, "team-a", day, 50, 0); err != nil || total != 350 {
		t.Fatalf("Add(50) = %d, %v; want 350", total, err)
	}
	if err := js.DeleteKeyValue(ctx, queue.UsageBucket); err != nil {
		t.Fatal(err)
	}
	if got, err := worker.Day(ctx, "team-a", day); err != nil || got.Tokens != 50 {
		t.Fatalf("Day with the shared bucket gone = %+v, %v; want 50", got, err)
	}
	olderBucket()
	mu.Lock()
	now = now.Add(queue.SharedRelook + time.Second)
	mu.Unlock()
	if got, err := worker.Day(ctx, "team-a", day); err != nil || got.Tokens != 350 {
		t.Errorf("Day with the shared bucket back = %+v, %v; want 350, the older workers' 300 and 50", got, err)
	}
}

func mustMarshal(t *testing.T, v any) []byte {
	t.Helper()
	data, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return data
}
