package runner_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/boxcar-run/boxcar/internal/agent"
	"github.com/boxcar-run/boxcar/internal/job"
	"github.com/boxcar-run/boxcar/internal/queue"
	"github.com/boxcar-run/boxcar/internal/runner"
	"github.com/boxcar-run/boxcar/internal/store"
)

// cancelAfterLook is a worker's queue that, right after the worker's first look at the job's
// status, has the job's cancel recorded as another worker's cancel watch records it: a cancel
// written between that look (admit's, or the exhausted delivery's) and the end the delivery
// commits, which this worker's own watch has not seen yet (it would stop the attempt itself).
type cancelAfterLook struct {
	runner.Queue
	peer  *queue.Consumer // the other worker's
	id    string
	fired atomic.Bool
}

func (q *cancelAfterLook) Status(ctx context.Context, r queue.Ref) (job.Status, error) {
	st, err := q.Queue.Status(ctx, r)
	if r.ID == q.id && q.fired.CompareAndSwap(false, true) {
		if _, err := q.peer.UpdateStatus(context.Background(), r, job.RequestCancel); err != nil {
			return st, err
		}
	}
	return st, err
}

// TestCancelBetweenTheLookAndTheEndEndsOnce: a delivery that does not run its job (admit
// refuses it; or the job exhausted its deliveries) looks for a cancel, finds none, and another
// worker's watch records a cancel just after, before that delivery commits its end. The cancel came before the end
// was decided: the job ends once, cancelled, its status and manifest agreeing and no dead
// letter, not a cancelled status beside a rejected or dead manifest and its dead letter.
func TestCancelBetweenTheLookAndTheEndEndsOnce(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		name string
		// queue submits the job and leaves it as the delivery under test will find it.
		queue func(b *bundle) job.Job
	}{
		{"refused at admit", func(b *bundle) job.Job {
			j := b.newJob("q", "t") // a profile no worker defines
			b.publish(j)
			return j
		}},
		{"exhausted", func(b *bundle) job.Job {
			oneDelivery(b)
			j, _ := b.killedMidRun(nil)
			// The last delivery's worker died before its claim: the status is the retrying of
			// the delivery before it.
			_, q := b.connect()
			if _, err := q.UpdateStatus(context.Background(), queue.Ref{Tenant: job.DefaultTenant, ID: j.ID}, func(s *job.Status) {
				s.State = job.StateRetrying
			}); err != nil {
				b.t.Fatal(err)
			}
			return j
		}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			j := tt.queue(b)
			b.worker(agentFunc(func(ctx context.Context, req agent.Request) (agent.Result, error) {
				t.Errorf("the job ran")
				return writeReport(ctx, req)
			}), func(c *runner.Config) {
				_, peer := b.connect()
				c.Queue = &cancelAfterLook{Queue: c.Queue, peer: peer, id: j.ID}
			})
			final := b.waitFinal(j.ID, 30*time.Second)
			waitFor(t, 20*time.Second, "the job's manifest", func() bool {
				_, err := b.store.Stat(context.Background(), store.ManifestKey(j.ID))
				return err == nil
			})
			waitFor(t, 20*time.Second, "the job to be consumed", b.consumed)
			m := b.manifest(j.ID)
			if final.State != job.StateCancelled || m.Predicate.Outcome.State != job.StateCancelled {
				t.Errorf("status %s (%q), manifest %s (%q); want both cancelled", final.State, final.Error, m.Predicate.Outcome.State, m.Predicate.Outcome.Error)
			}
			if dls := reasons(b.deadLetters()); len(dls) > 0 {
				t.Errorf("a job cancelled before its end was decided was dead-lettered: %q", dls)
			}
		})
	}
}
