package runner_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/boxcar-run/boxcar/internal/agent"
	"github.com/boxcar-run/boxcar/internal/job"
)

// TestCancelStopsOnlyTheJobAsked: a worker runs two jobs at once and one watch serves both; a
// cancel of one stops that one, and the other runs on to success.
func TestCancelStopsOnlyTheJobAsked(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	var mu sync.Mutex
	release := map[string]chan struct{}{}
	running := make(chan string, 2)
	w := b.worker(agentFunc(func(ctx context.Context, req agent.Request) (agent.Result, error) {
		mu.Lock()
		ch := release[req.JobID]
		mu.Unlock()
		running <- req.JobID
		select {
		case <-ctx.Done():
			return agent.Result{}, ctx.Err()
		case <-ch:
			return writeReport(ctx, req)
		}
	}))
	keep, stop := b.submitHeld(&mu, release), b.submitHeld(&mu, release)
	for range 2 {
		<-running
	}
	if _, err := b.q.Cancel(ctx, stop.ID, "tester"); err != nil {
		t.Fatal(err)
	}
	if st := b.waitFinal(stop.ID, 10*time.Second); st.State != job.StateCancelled {
		t.Fatalf("the job asked to stop ended %s, want cancelled", st.State)
	}
	if st, err := b.q.Status(ctx, keep.ID); err != nil || st.State != job.StateRunning {
		t.Fatalf("the other job is %q (%v), want still running", st.State, err)
	}
	close(release[keep.ID])
	if st := b.waitFinal(keep.ID, 10*time.Second); st.State != job.StateSucceeded {
		t.Fatalf("the other job ended %s: %s, want succeeded", st.State, st.Error)
	}
	w.stop()
}

// submitHeld submits a job whose agent waits until its channel in release is closed.
func (b *bundle) submitHeld(mu *sync.Mutex, release map[string]chan struct{}) job.Job {
	b.t.Helper()
	mu.Lock()
	defer mu.Unlock()
	j := b.submit("p")
	release[j.ID] = make(chan struct{})
	return j
}

// TestCancelAskedWhileNoWorkerRanTheJob: the worker running a job dies, and the job is
// cancelled before its redelivery; the next worker stops it at once, without running the agent.
func TestCancelAskedWhileNoWorkerRanTheJob(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	j, _ := b.killedMidRun(nil)
	st, err := b.q.Cancel(ctx, j.ID, "tester")
	if err != nil || !st.CancelRequested {
		t.Fatalf("cancel of the running job: %+v, %v; want a cancel request", st, err)
	}

	ran := make(chan struct{}, 1)
	b.worker(agentFunc(func(ctx context.Context, req agent.Request) (agent.Result, error) {
		ran <- struct{}{}
		return writeReport(ctx, req)
	}))
	if st := b.waitFinal(j.ID, 20*time.Second); st.State != job.StateCancelled || st.Attempt != 2 {
		t.Fatalf("status = %+v, want cancelled in attempt 2", st)
	}
	select {
	case <-ran:
		t.Error("the agent ran for a job cancelled before its attempt began")
	default:
	}
}
