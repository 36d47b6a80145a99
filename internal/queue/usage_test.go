package queue_test

import (
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/boxcar-run/boxcar/internal/queue"
)

// TestUsageAddsUp: workers adding a tenant's tokens at the same time lose none of them (each
// addition is a compare-and-set), and each tenant and UTC day has its own count.
func TestUsageAddsUp(t *testing.T) {
	t.Parallel()
	nc := connect(t, false)
	ctx := t.Context()
	if _, err := queue.OpenUsage(ctx, nc, 1, false); !errors.Is(err, queue.ErrNoUsage) {
		t.Fatalf("a client before any worker: %v, want ErrNoUsage", err)
	}
	workers := make([]*queue.Usage, 4)
	for i := range workers {
		wc, err := queue.Connect(ctx, queue.ConnOptions{URL: nc.ConnectedUrl(), Name: "worker"})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(wc.Close)
		u, err := queue.OpenUsage(ctx, wc, 1, true)
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
	client, err := queue.OpenUsage(ctx, nc, 1, false)
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
	u, err := queue.OpenUsage(t.Context(), connect(t, false), 1, true)
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
	u, err := queue.OpenUsage(t.Context(), nc, 1, true)
	if err != nil {
		t.Fatal(err)
	}
	looks, err := nc.SubscribeSync("$JS.API.STREAM.INFO.KV_" + queue.UsageBucket)
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
