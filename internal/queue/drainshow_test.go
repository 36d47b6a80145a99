package queue_test

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/boxcar-run/boxcar/internal/job"
	"github.com/boxcar-run/boxcar/internal/queue"
	"github.com/boxcar-run/boxcar/test/harness"
)

// TestDrainingJobsShowToTheirTenant: a job an older Boxcar queued in the shared stream, which
// the tenant's consumer there delivers while the upgrade drains it, is queued to its tenant's
// `submit status` (and so `watch`, `logs` and `cancel`, which read it), and the queue line
// counts it; to another tenant it is unknown. Before, the client looked in the tenant's own
// stream only: the job was unknown until a worker took it, `cancel` refused it, and the queue
// line showed none waiting.
func TestDrainingJobsShowToTheirTenant(t *testing.T) {
	t.Parallel()
	cfg := drainConfig()
	f := newOlderFleet(t, cfg, "team-a", "team-b")
	waiting, running := job.NewID(), job.NewID()
	f.publishOld(t, "team-a", running)
	f.publishOld(t, "team-a", waiting)
	f.runOld(t, "team-a") // the older of the two, running
	f.setUp(t)
	f.submit(t, "team-a", job.NewID())

	a := f.client(t, "team-a")
	st, err := a.Status(t.Context(), waiting)
	if err != nil || st.State != job.StateQueued {
		t.Errorf("status of a job waiting in the shared stream: %+v, %v; want queued", st, err)
	}
	// The server counts a consumer's pending messages after it stores them, not with the
	// publish's ack: read at once, the job just submitted was not counted under load.
	harness.Wait(t, "the tenant's queue to count 2 waiting and 1 running, 2 of them in the shared stream", func() (bool, error) {
		lag, err := a.Lag(t.Context())
		return err == nil && lag.Pending == 2 && lag.InFlight == 1 && lag.Shared == 2, fmt.Errorf("%+v, %v", lag, err)
	}, harness.Within(10*time.Second))
	if stream, n, err := a.SharedWaiting(t.Context()); err != nil || stream != cfg.Stream || n != 1 {
		t.Errorf("the tenant's jobs waiting unlisted in the shared stream: %s %d, %v; want 1 in %s (the other runs)", stream, n, err, cfg.Stream)
	}
	if st, err := a.Cancel(t.Context(), waiting, "test"); err != nil || !st.CancelRequested {
		t.Errorf("cancel of a job waiting in the shared stream: %+v, %v; want it requested", st, err)
	}
	b := f.client(t, "team-b")
	if st, err := b.Status(t.Context(), waiting); !errors.Is(err, queue.ErrUnknownJob) {
		t.Errorf("another tenant's status of the job: %+v, %v; want it unknown", st, err)
	}
	if _, n, err := b.SharedWaiting(t.Context()); err != nil || n != 0 {
		t.Errorf("another tenant's jobs waiting in the shared stream: %d, %v; want none", n, err)
	}
	if lag, err := b.Lag(t.Context()); err != nil || lag.Pending != 0 || lag.InFlight != 0 {
		t.Errorf("another tenant's queue: %+v, %v; want none", lag, err)
	}
}
