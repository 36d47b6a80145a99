package queue_test

import (
	"errors"
	"testing"
	"time"

	"github.com/boxcar-run/boxcar/internal/config"
	"github.com/boxcar-run/boxcar/internal/job"
	"github.com/boxcar-run/boxcar/internal/queue"
)

// TestDrainingJobsShowToTheirTenant: a job an older Boxcar queued in the shared stream, which
// the tenant's consumer there delivers while the upgrade drains it, is queued to its tenant's
// `submit status` (and so `watch`, `logs` and `cancel`, which read it), and the queue line
// counts it; to another tenant it is unknown. Before, the client looked in the tenant's own
// stream only: the job was unknown until a worker took it, `cancel` refused it, and the queue
// line showed none waiting.
func TestDrainingJobsShowToTheirTenant(t *testing.T) {
	t.Parallel()
	cfg := config.Config{}.WithDefaults().NATS
	cfg.AckWait = config.Duration(time.Hour)
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
	lag, err := a.Lag(t.Context())
	if err != nil || lag.Pending != 2 || lag.InFlight != 1 || lag.Shared != 2 {
		t.Errorf("the tenant's queue: %+v, %v; want 2 waiting and 1 running, 2 of them in the shared stream", lag, err)
	}
	if st, err := a.Cancel(t.Context(), waiting, "test"); err != nil || !st.CancelRequested {
		t.Errorf("cancel of a job waiting in the shared stream: %+v, %v; want it requested", st, err)
	}
	b := f.client(t, "team-b")
	if st, err := b.Status(t.Context(), waiting); !errors.Is(err, queue.ErrUnknownJob) {
		t.Errorf("another tenant's status of the job: %+v, %v; want it unknown", st, err)
	}
	if lag, err := b.Lag(t.Context()); err != nil || lag.Pending != 0 || lag.InFlight != 0 {
		t.Errorf("another tenant's queue: %+v, %v; want none", lag, err)
	}
}
