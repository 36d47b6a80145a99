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
