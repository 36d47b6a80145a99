package runner_test

import (
	"context"
	"testing"
	"time"

	"github.com/boxcar-run/boxcar/internal/job"
	"github.com/boxcar-run/boxcar/internal/store"
)

// TestAuditCancelledQueuedJobRejectedAtAdmitKeepsOneEnd: a job is cancelled while it waits in
// the queue (no worker has looked at it yet), and the worker that then delivers it cannot
// admit it (its profile is one this worker does not define, and no peer does). The cancel
// came first: the status says cancelled. The delivery never reaches the claim, which is where
// a cancel is honoured, so it commits a manifest that says rejected and dead-letters the job
// as unknown_profile under a status that says cancelled. One job, two ends: `submit status`
// says cancelled, `submit manifest`/`verify` and the dead letter say rejected.
func TestAuditCancelledQueuedJobRejectedAtAdmitKeepsOneEnd(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	j := b.newJob("nope", "t") // a profile no worker defines
	b.publish(j)
	st, err := b.q.Cancel(ctx, j.ID, "tester")
	if err != nil || !st.CancelRequested {
		t.Fatalf("cancel of the queued job: %+v, %v", st, err)
	}
	b.worker(agentFunc(writeReport))
	final := b.waitFinal(j.ID, 20*time.Second)
	waitFor(t, 20*time.Second, "the job's manifest", func() bool {
		_, err := b.store.Stat(ctx, store.ManifestKey(j.ID))
		return err == nil
	})
	waitFor(t, 20*time.Second, "the job to be consumed", b.consumed)
	m := b.manifest(j.ID)
	var letters []string
	for _, dl := range b.deadLetters() {
		if dl.JobID == j.ID {
			letters = append(letters, dl.Reason)
		}
	}
	if final.State != m.Predicate.Outcome.State {
		t.Errorf("status says %s (%q), the committed manifest %s (%q), dead letters %q: the job has two ends",
			final.State, final.Error, m.Predicate.Outcome.State, m.Predicate.Outcome.Error, letters)
	}
	if final.State == job.StateCancelled && len(letters) > 0 {
		t.Errorf("a job whose status says cancelled was dead-lettered: %q", letters)
	}
}
