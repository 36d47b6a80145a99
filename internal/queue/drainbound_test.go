package queue_test

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/boxcar-run/boxcar/internal/config"
	"github.com/boxcar-run/boxcar/internal/job"
	"github.com/boxcar-run/boxcar/internal/queue"
	"github.com/boxcar-run/boxcar/test/harness"
)

// TestDrainingTenantKeepsItsBoundAcrossBothStreams: while the shared stream of an older Boxcar
// holds jobs of a tenant, the tenant's jobs in flight on its two consumers together (on the
// shared stream, and on its own stream) stay within its max_concurrent: a worker takes
// another only once one of them ends, whichever stream it came from and whichever worker
// (an old one too) runs it. Before, each consumer allowed max_concurrent of its own, and the
// tenant ran up to twice its bound while it drained.
func TestDrainingTenantKeepsItsBoundAcrossBothStreams(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name     string
		old, new int  // the tenant's jobs in the shared stream and in its own
		oldRuns  bool // an old worker runs the first of those in the shared stream
	}{
		{name: "its own stream's job waits for the shared stream's", old: 2, new: 1},
		{name: "a job an old worker runs counts", old: 1, new: 2, oldRuns: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			const most = 2
			cfg := drainConfig()
			f := newOlderFleet(t, cfg, "team-a")
			f.tenants["team-a"] = config.Tenant{MaxConcurrent: most}
			for range tc.old {
				f.publishOld(t, "team-a", job.NewID())
			}
			running := []func() error{} // the ends of the jobs in flight, oldest first
			if tc.oldRuns {
				m := f.runOld(t, "team-a")
				running = append(running, func() error { return m.DoubleAck(t.Context()) })
			}
			f.setUp(t)
			for range tc.new {
				f.submit(t, "team-a", job.NewID())
			}
			w := f.open(t, cfg, f.tenants, nil)
			for len(running) < most {
				d := fetch(t, w, harness.Timeout(30*time.Second))
				running = append(running, func() error { return d.Ack(t.Context()) })
			}

			// The worker looks at the tenant's consumer on the shared stream before each
			// fetch: once it looked twice, it has had its chance to take a third job.
			var looks atomic.Int64
			sub, err := f.nc.Subscribe("$JS.API.CONSUMER.INFO."+cfg.Stream+"."+cfg.Consumer+"-team-a", func(*nats.Msg) { looks.Add(1) })
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = sub.Unsubscribe() })
			if err := f.nc.Flush(); err != nil {
				t.Fatal(err)
			}
			got := make(chan *queue.Delivery, 1)
			ctx, cancel := context.WithTimeout(t.Context(), harness.Timeout(time.Minute))
			defer cancel()
			go func() {
				d, err := w.Fetch(ctx)
				if err != nil {
					d = nil
				}
				got <- d
			}()
			var third *queue.Delivery
			harness.Wait(t, "the worker to look twice at its tenant's jobs in flight, or to take a third", func() (bool, error) {
				select {
				case third = <-got:
					return true, nil
				default:
				}
				return looks.Load() >= 2, fmt.Errorf("%d looks", looks.Load())
			})
			if third != nil {
				t.Fatalf("the worker took job %s while %d of the tenant's jobs ran, its max_concurrent: %d in flight across the two streams", third.JobID, most, most+1)
			}
			if err := running[0](); err != nil {
				t.Fatal(err)
			}
			select {
			case third = <-got:
			case <-ctx.Done():
				t.Fatal("the worker took no job once one of the tenant's ended")
			}
			if third == nil {
				t.Fatal("the fetch failed once one of the tenant's jobs ended")
			}
			if err := third.Ack(t.Context()); err != nil && !errors.Is(err, jetstream.ErrMsgAlreadyAckd) {
				t.Fatal(err)
			}
			for _, end := range running[1:] {
				if err := end(); err != nil {
					t.Fatal(err)
				}
			}
		})
	}
}
