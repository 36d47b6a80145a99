package queue_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/boxcar-run/boxcar/internal/config"
	"github.com/boxcar-run/boxcar/internal/queue"
	"github.com/boxcar-run/boxcar/test/harness"
)

func TestConsumerLag(t *testing.T) {
	t.Parallel()
	// An AckWait no busy machine outlasts: a redelivery would change the counts.
	b := setup(t, func(c *config.NATS) { c.AckWait = config.Duration(time.Hour) })
	ctx := context.Background()
	// The server counts a consumer's pending messages after it stores them, not with the
	// publish ack, so the lag is read until it settles, as a dashboard would.
	lag := func(t *testing.T, wantPending, wantAckPending uint64) {
		t.Helper()
		harness.Wait(t, "the consumer's lag to settle", func() (bool, error) {
			lags, err := b.w.ConsumerLag(ctx)
			if err != nil || len(lags) != 1 || lags[0].Tenant != tenant {
				t.Fatalf("ConsumerLag: %+v, %v; want tenant %s's", lags, err, tenant)
			}
			pending, ackPending := lags[0].Pending, lags[0].AckPending
			return pending == wantPending && ackPending == wantAckPending,
				fmt.Errorf("ConsumerLag = (%d, %d), want (%d, %d)", pending, ackPending, wantPending, wantAckPending)
		}, harness.Within(10*time.Second))
	}
	lag(t, 0, 0)
	for range 3 {
		b.submit(t)
	}
	lag(t, 3, 0)
	d := fetch(t, b.w, 5*time.Second)
	lag(t, 2, 1)
	if err := d.Ack(ctx); err != nil {
		t.Fatal(err)
	}
	lag(t, 2, 0)
}

// TestStartableCountsWhatCanStart: a tenant's pending jobs count towards the pool's demand only
// as many as its max_concurrent lets start; the other tenant's all count.
func TestStartableCountsWhatCanStart(t *testing.T) {
	t.Parallel()
	b := setup(t, func(c *config.NATS) { c.AckWait = config.Duration(time.Hour) })
	tenants := map[string]config.Tenant{"team-a": {MaxConcurrent: 2}, "team-b": {}}
	w := b.open(t, b.cfg, tenants, nil)
	for tenant, n := range map[string]int{"team-a": 5, "team-b": 3} {
		for range n {
			if _, err := b.client(t, tenant).Publish(t.Context(), newJob(t)); err != nil {
				t.Fatal(err)
			}
		}
	}
	total := func(wantPending, wantAckPending uint64) {
		t.Helper()
		harness.Wait(t, "the lag to settle", func() (bool, error) {
			lags, err := w.ConsumerLag(t.Context())
			var pending, ackPending uint64
			for _, l := range lags {
				pending += l.Startable()
				ackPending += l.AckPending
			}
			return err == nil && pending == wantPending && ackPending == wantAckPending,
				fmt.Errorf("startable %d, in flight %d (%v), want %d and %d", pending, ackPending, err, wantPending, wantAckPending)
		}, harness.Within(10*time.Second))
	}
	total(2+3, 0) // team-a: 2 of its 5 could start
	var held []*queue.Delivery
	for range 2 {
		held = append(held, fetch(t, w, harness.Timeout(time.Minute)))
	}
	ackPendingA := 0
	for _, d := range held {
		if d.Tenant == "team-a" {
			ackPendingA++
		}
	}
	startableA := 2 - ackPendingA
	pendingB := 3 - (2 - ackPendingA)
	total(uint64(startableA+pendingB), 2)
	for _, d := range held {
		if err := d.Ack(t.Context()); err != nil {
			t.Fatal(err)
		}
	}
}

// A client handle knows only the default ack_wait; ConsumerAckWait reads the worker's.
func TestConsumerAckWaitIsTheServers(t *testing.T) {
	t.Parallel()
	b := setup(t, func(c *config.NATS) { c.AckWait = config.Duration(7 * time.Minute) })
	client, err := queue.NewClient(t.Context(), b.nc, config.Config{}.WithDefaults().NATS, "default")
	if err != nil {
		t.Fatal(err)
	}
	if got, err := client.ConsumerAckWait(t.Context()); err != nil || got != 7*time.Minute {
		t.Errorf("ConsumerAckWait = %v, %v; want the worker's 7m", got, err)
	}
}
