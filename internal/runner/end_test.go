package runner_test

import (
	"context"
	"errors"
	"path"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/boxcar-run/boxcar/internal/agent"
	"github.com/boxcar-run/boxcar/internal/job"
	"github.com/boxcar-run/boxcar/internal/provenance"
	"github.com/boxcar-run/boxcar/internal/queue"
	"github.com/boxcar-run/boxcar/internal/runner"
	"github.com/boxcar-run/boxcar/internal/store"
)

// oneDelivery makes every job's first delivery its last.
func oneDelivery(b *bundle) {
	b.cfg.NATS.MaxDeliver = 1
	b.nc, b.q = b.client()
}

// checkEnd checks the one end a job must have, from the final state: its status, its dead
// letters, the committed manifest (every job that ran or died has one) and the job stream.
func (b *bundle) checkEnd(id string, state job.State, deadLetters int) {
	b.t.Helper()
	ctx := context.Background()
	st := b.waitFinal(id, 30*time.Second)
	m := b.manifest(id)
	if st.State != state || m.Predicate.Outcome.State != state {
		b.t.Errorf("status %s, manifest %s; want both %s", st.State, m.Predicate.Outcome.State, state)
	}
	if st.Attempt != m.Predicate.Attempt || st.Worker != m.Predicate.Worker.ID {
		b.t.Errorf("status names attempt %d by %q, the manifest attempt %d by %q", st.Attempt, st.Worker, m.Predicate.Attempt, m.Predicate.Worker.ID)
	}
	if _, err := provenance.Verify(ctx, b.store, id, nil); err != nil {
		b.t.Errorf("verify: %v", err)
	}
	waitFor(b.t, 10*time.Second, "the job stream to be empty", func() bool {
		js, _ := jetstream.New(b.nc)
		s, err := js.Stream(ctx, queue.JobStream(b.cfg.NATS, "default"))
		if err != nil {
			return false
		}
		info, err := s.Info(ctx)
		return err == nil && info.State.Msgs == 0
	})
	var n int
	for _, dl := range b.deadLetters() {
		if dl.JobID == id {
			n++
			if dl.Reason != "max_deliveries" {
				b.t.Errorf("dead letter reason %q, want max_deliveries", dl.Reason)
			}
		}
	}
	if n != deadLetters {
		b.t.Errorf("%d dead letters, want %d", n, deadLetters)
	}
}

// TestJobWhoseLastDeliveryDiedWhileNoWorkerRanIsDeadLettered (issue 10 item 1): every worker
// is down when the job's last delivery times out. The next worker to start ends it as dead,
// once; the job is not left running for ever.
func TestJobWhoseLastDeliveryDiedWhileNoWorkerRanIsDeadLettered(t *testing.T) {
	t.Parallel()
	b := setup(t)
	oneDelivery(b)
	started := make(chan struct{})
	var once sync.Once
	w := b.worker(agentFunc(func(ctx context.Context, req agent.Request) (agent.Result, error) {
		once.Do(func() { close(started) })
		<-ctx.Done()
		return agent.Result{}, ctx.Err()
	}))
	j := b.submit("p")
	<-started
	w.nc.Close() // killed: no ack, no nak, no word
	w.stop()
	// Nobody runs while the ack deadline of the last delivery passes.
	deadline := time.Now().Add(b.cfg.NATS.AckWait.Std() + time.Second)
	waitFor(t, time.Minute, "the last delivery's ack deadline", func() bool { return time.Now().After(deadline) })

	next := b.worker(agentFunc(func(ctx context.Context, req agent.Request) (agent.Result, error) {
		t.Errorf("an exhausted job ran again")
		return writeReport(ctx, req)
	}))
	b.checkEnd(j.ID, job.StateDead, 1)
	// An operator's dashboard counts the death once, on the worker that ended the job.
	waitFor(t, 10*time.Second, "boxcar_jobs_total{dead} = 1", func() bool {
		return testutil.ToFloat64(next.m.Jobs.WithLabelValues("p", "dead")) == 1
	})
}

// TestCommittedLastDeliveryWhoseWorkerDiedIsNotDeadLettered (issue 10 item 1): the last
// delivery commits, and its worker dies before the ack. The job ends as committed, with no
// dead letter.
func TestCommittedLastDeliveryWhoseWorkerDiedIsNotDeadLettered(t *testing.T) {
	t.Parallel()
	b := setup(t)
	oneDelivery(b)
	var first atomic.Pointer[worker] // set before the job is published, read by the worker's hook
	dies := &hookStore{Store: b.shared, afterCreate: func(key string) {
		if path.Base(key) == "manifest.json" {
			first.Load().nc.Close() // killed between the commit and the ack
		}
	}}
	first.Store(b.worker(agentFunc(writeReport), func(c *runner.Config) { c.Store = dies }))
	j := b.submit("p")
	waitFor(t, 10*time.Second, "the commit", func() bool {
		_, err := b.store.Stat(context.Background(), store.ManifestKey(j.ID))
		return err == nil
	})
	b.worker(agentFunc(writeReport))
	b.checkEnd(j.ID, job.StateSucceeded, 0)
}

// TestStaleLastDeliveryCannotCommitAfterTheJobDied (issue 10 item 1): the last delivery's
// worker stalls in its upload past AckWait; the job is ended as dead meanwhile; then the stalled
// worker resumes. The job keeps its one end: dead, one dead letter, and the manifest says so.
func TestStaleLastDeliveryCannotCommitAfterTheJobDied(t *testing.T) {
	t.Parallel()
	b := setup(t)
	oneDelivery(b)
	var paused sync.Once
	uploading := make(chan struct{})
	stalls := &hookStore{Store: b.shared}
	stalls.put = func(key string) error {
		paused.Do(func() {
			close(uploading)
			waitFor(t, 30*time.Second, "the job's dead letter", func() bool { return len(b.deadLetters()) > 0 })
		})
		return nil
	}
	stale := b.worker(agentFunc(writeReport), func(c *runner.Config) {
		c.Store, c.HeartbeatInterval, c.Worker.Concurrency = stalls, time.Hour, 1
	})
	j := b.submit("p")
	<-uploading
	b.worker(agentFunc(writeReport))
	b.checkEnd(j.ID, job.StateDead, 1)
	waitFor(t, 30*time.Second, "the stalled attempt to end", func() bool {
		return testutil.ToFloat64(stale.m.StaleAttempts) == 1
	})
	b.checkEnd(j.ID, job.StateDead, 1)
}

// TestStaleAttemptsRetryDoesNotDisturbTheNextDelivery: attempt 1 stalls past the ack wait
// (no heartbeat: a GC pause, a frozen VM) and the job is delivered again to another worker.
// Then attempt 1's agent fails transiently. A retry commits nothing, so its status write is
// its lease check: it finds attempt 2's status and settles nothing, counting a stale attempt.
// (Settled as if it held the job, it wrote "retrying", naming attempt 1, over attempt 2's
// "running", and naked the message, which the server applies to the delivery attempt 2
// holds: after the backoff the job was delivered a third time while attempt 2 still ran.)
func TestStaleAttemptsRetryDoesNotDisturbTheNextDelivery(t *testing.T) {
	t.Parallel()
	b := setup(t)
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
	stalled := b.worker(a, func(c *runner.Config) { c.HeartbeatInterval, c.Worker.Concurrency = time.Hour, 1 })
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
	if n := testutil.ToFloat64(stalled.m.StaleAttempts); n != 1 {
		t.Errorf("boxcar_stale_attempts_total of the stalled worker = %v, want 1", n)
	}
}
