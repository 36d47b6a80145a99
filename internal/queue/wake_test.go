package queue_test

import (
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/boxcar-run/boxcar/internal/config"
	"github.com/boxcar-run/boxcar/internal/queue"
	"github.com/boxcar-run/boxcar/test/harness"
)

// pullCounter counts the pull requests sent to the job stream's consumers: each call says how
// many there were until then (the flush brings every one sent before it into the channel).
func pullCounter(t *testing.T, b bundle) func() int {
	t.Helper()
	ch := make(chan *nats.Msg, 4096)
	sub, err := b.nc.ChanSubscribe("$JS.API.CONSUMER.MSG.NEXT.>", ch)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sub.Unsubscribe() })
	n := 0
	return func() int {
		t.Helper()
		if err := b.nc.Flush(); err != nil {
			t.Fatal(err)
		}
		for {
			select {
			case <-ch:
				n++
			default:
				return n
			}
		}
	}
}

// TestIdleWorkerOfSeveralTenantsWaitsForANewJob: a worker of several tenants with nothing to
// do sends no pulls while idle (before, it asked each tenant's consumer in turn, 250 ms each,
// so a job of the last tenant waited for all the others); a new job of any tenant wakes it,
// and its next pull goes to that tenant first.
func TestIdleWorkerOfSeveralTenantsWaitsForANewJob(t *testing.T) {
	t.Parallel()
	b := setup(t)
	tenants := map[string]config.Tenant{"team-a": {}, "team-b": {}, "team-c": {}, "team-d": {}}
	w := b.open(t, b.cfg, tenants, nil)
	w.SetIdleCheck(time.Hour) // only a notification can end the wait
	pulls := pullCounter(t, b)
	for _, tenant := range []string{"team-d", "team-b"} {
		done := fetchAcked(t, w)
		harness.Wait(t, "the worker idle, waiting for a new job", func() (bool, error) { return w.Idle(), nil })
		before := pulls()
		if _, err := b.client(t, tenant).Publish(t.Context(), newJob(t)); err != nil {
			t.Fatal(err)
		}
		acked(t, done, "a job of "+tenant+" did not wake the idle worker")
		if got := pulls() - before; got != 1 {
			t.Errorf("%d pulls from the notification of %s's job to its delivery, want 1 (to %s first)", got, tenant, tenant)
		}
	}
}

// TestIdleWorkerNotNotifiedPolls: on a job stream that sends no notifications (set up before
// they existed), a job is still found, by the round after idleCheck; the worker says so once
// and polls while idle, until a notification comes again.
func TestIdleWorkerNotNotifiedPolls(t *testing.T) {
	t.Parallel()
	b := setup(t)
	tenants := map[string]config.Tenant{"team-a": {}, "team-b": {}}
	w := b.open(t, b.cfg, tenants, nil)
	for tenant := range tenants {
		s, err := b.js.Stream(t.Context(), queue.JobStream(b.cfg, tenant))
		if err != nil {
			t.Fatal(err)
		}
		older := s.CachedInfo().Config
		older.RePublish = nil
		if _, err := b.js.UpdateStream(t.Context(), older); err != nil {
			t.Fatal(err)
		}
	}
	w.SetIdleCheck(300 * time.Millisecond)
	// A job published after the worker's idleCheck ran out, while it asks each tenant before
	// its next idle wait, is found by that round, which was no round after idleCheck: it says
	// nothing of polling. Only a job published during an idle wait must be found by the round
	// that ends it, so a worker found polling by none of a few jobs does not poll.
	for try := 1; !w.Polling(); try++ {
		if try > 5 {
			t.Fatal("jobs found with no notification after idleCheck; the worker does not poll")
		}
		done := fetchAcked(t, w)
		harness.Wait(t, "the worker idle, waiting for a new job", func() (bool, error) { return w.Idle(), nil })
		if _, err := b.client(t, "team-b").Publish(t.Context(), newJob(t)); err != nil {
			t.Fatal(err)
		}
		acked(t, done, "a job with no notification was not found by the round after idleCheck")
	}

	// The stream set up again sends notifications: the first one ends the polling.
	b.open(t, b.cfg, tenants, nil)
	if _, err := b.client(t, "team-a").Publish(t.Context(), newJob(t)); err != nil {
		t.Fatal(err)
	}
	d := fetch(t, w, harness.Timeout(time.Minute))
	if err := d.Ack(t.Context()); err != nil {
		t.Fatal(err)
	}
	harness.Wait(t, "the worker listening again", func() (bool, error) { return !w.Polling(), nil })
}

// TestIdleWorkerAsksATenantAtItsCap: jobs of a tenant at its max_concurrent wait, and the one
// that ends may end on another worker, which sends no notification: a worker that finds no job
// while some wait goes on asking, and takes the next job once the first is acknowledged.
func TestIdleWorkerAsksATenantAtItsCap(t *testing.T) {
	t.Parallel()
	b := setup(t, func(c *config.NATS) { c.AckWait = config.Duration(time.Hour) })
	tenants := map[string]config.Tenant{"team-a": {MaxConcurrent: 1}, "team-b": {}}
	w1, w2 := b.open(t, b.cfg, tenants, nil), b.open(t, b.cfg, tenants, nil)
	w2.SetIdleCheck(time.Hour)
	pulls := pullCounter(t, b)
	for range 2 {
		if _, err := b.client(t, "team-a").Publish(t.Context(), newJob(t)); err != nil {
			t.Fatal(err)
		}
	}
	first := fetch(t, w1, harness.Timeout(time.Minute))
	before := pulls()
	done := fetchAcked(t, w2)
	harness.Wait(t, "a round of the second worker", func() (bool, error) { return pulls()-before >= 2, nil })
	if err := first.Ack(t.Context()); err != nil {
		t.Fatal(err)
	}
	acked(t, done, "team-a's second job waits for a notification that never comes")
}

// fetchAcked fetches w's next job and acknowledges it in the background; the channel gets nil
// once it is acknowledged, or the error.
func fetchAcked(t *testing.T, w *queue.Consumer) <-chan error {
	done := make(chan error, 1)
	go func() {
		d, err := w.Fetch(t.Context())
		if err == nil {
			err = d.Ack(t.Context())
		}
		done <- err
	}()
	return done
}

// acked waits for fetchAcked's result, and fails with why when none comes within a minute
// (longer on a slow machine: harness.Timeout).
func acked(t *testing.T, done <-chan error, why string) {
	t.Helper()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(harness.Timeout(time.Minute)):
		t.Fatal(why)
	}
}
