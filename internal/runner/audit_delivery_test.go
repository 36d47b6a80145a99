package runner_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/boxcar-run/boxcar/internal/agent"
	"github.com/boxcar-run/boxcar/internal/job"
	"github.com/boxcar-run/boxcar/internal/runner"
)

// TestAuditStaleAttemptsRetryDoesNotDisturbTheNextDelivery: attempt 1 stalls past the ack wait
// (no heartbeat: a GC pause, a frozen VM) and the job is delivered again to another worker.
// Then attempt 1's agent fails transiently. Nothing checks that attempt 1 still holds the job
// before it settles (the lease is checked only at a commit): it writes "retrying", naming
// attempt 1, over attempt 2's "running", and naks the message, which the server applies to
// the delivery attempt 2 holds: after the backoff the job is delivered a third time while
// attempt 2 still runs.
func TestAuditStaleAttemptsRetryDoesNotDisturbTheNextDelivery(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	j := b.newJob("p", "t")
	var calls atomic.Int32
	staleStarted := make(chan struct{})
	var sawRetrying atomic.Value // the status attempt 2 saw written by the stale attempt
	third := make(chan struct{}, 1)
	a := agentFunc(func(ctx context.Context, req agent.Request) (agent.Result, error) {
		switch calls.Add(1) {
		case 1: // the stale attempt
			close(staleStarted)
			waitFor(t, 30*time.Second, "the second delivery to start", func() bool {
				st, err := b.q.Status(context.Background(), j.ID)
				return err == nil && st.Attempt >= 2 && st.State == job.StateRunning
			})
			return agent.Result{}, errors.New("model: connection reset by peer")
		case 2: // the delivery that holds the job now
			deadline := time.Now().Add(8 * time.Second)
			for time.Now().Before(deadline) {
				if st, err := b.q.Status(context.Background(), j.ID); err == nil && st.State != job.StateRunning {
					sawRetrying.Store(st)
				}
				select {
				case <-third:
					return writeReport(ctx, req)
				case <-time.After(100 * time.Millisecond):
				}
			}
			return writeReport(ctx, req)
		default: // a delivery that should not happen while the second runs
			third <- struct{}{}
			return writeReport(ctx, req)
		}
	})
	b.worker(a, func(c *runner.Config) { c.HeartbeatInterval, c.Worker.Concurrency = time.Hour, 1 })
	b.publish(j)
	<-staleStarted
	b.worker(a)
	st := b.waitFinal(j.ID, 60*time.Second)
	if n := calls.Load(); n != 2 {
		t.Errorf("the agent ran %d times; want 2 (the stale attempt and the one delivery after it): the stale attempt's nak redelivered the job while its next delivery ran", n)
	}
	if v := sawRetrying.Load(); v != nil {
		s := v.(job.Status)
		t.Errorf("while attempt 2 ran, its status became %s, attempt %d, error %q: the stale attempt overwrote it", s.State, s.Attempt, s.Error)
	}
	if st.State != job.StateSucceeded {
		t.Errorf("final state %s, want succeeded", st.State)
	}
	_ = ctx
}
