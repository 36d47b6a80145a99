package runner_test

import (
	"context"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/boxcar-run/boxcar/internal/agent"
	"github.com/boxcar-run/boxcar/internal/job"
	"github.com/boxcar-run/boxcar/internal/runner"
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

// TestCancelDuringTheUploadLetsTheCommitWin: the agent finished; while its run is uploaded,
// on the job's last delivery, the job is cancelled. The run is over: its commit wins
// (succeeded), or the job ends cancelled keeping what it produced; never dead. (Classified by
// the cause read before the upload, the upload's "context canceled" was a transient fault:
// dead, dead-lettered max_deliveries, the finished run discarded; classified by the cause
// read after it, cancelled, with only the transcript kept.)
func TestCancelDuringTheUploadLetsTheCommitWin(t *testing.T) {
	t.Parallel()
	b := setup(t)
	oneDelivery(b)
	ctx := context.Background()
	j := b.newJob("p", "t")
	var once atomic.Bool
	cancelling := &hookStore{Store: b.shared}
	cancelling.put = func(key string) error {
		if strings.Contains(key, j.ID+"/attempts/") && once.CompareAndSwap(false, true) {
			if _, err := b.q.Cancel(ctx, j.ID, "tester"); err != nil {
				t.Error(err)
			}
			waitFor(t, 10*time.Second, "the worker to act on the cancel", func() bool {
				st, err := b.q.Status(ctx, j.ID)
				return err == nil && st.CancelRequested
			})
		}
		return nil
	}
	b.worker(agentFunc(writeReport), func(c *runner.Config) { c.Store = cancelling })
	b.publish(j)
	st := b.waitFinal(j.ID, 30*time.Second)
	var letters []string
	for _, dl := range b.deadLetters() {
		if dl.JobID == j.ID {
			letters = append(letters, dl.Reason+": "+dl.Error)
		}
	}
	if !once.Load() {
		t.Fatal("the upload was never seen")
	}
	if st.State != job.StateCancelled && st.State != job.StateSucceeded || len(letters) > 0 {
		t.Errorf("job cancelled during its upload ended %s (error %q), dead letters %q; want cancelled (or succeeded), none", st.State, st.Error, letters)
	}
	// What the run produced is kept: a cancelled run's report says how it ended, then what the
	// job wrote.
	if report := b.runFile(j.ID, "report.md"); !strings.Contains(string(report), "# report for "+j.ID) {
		t.Errorf("the committed report %q does not hold what the run wrote: the finished run was thrown away", report)
	}
}
