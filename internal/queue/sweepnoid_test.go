package queue_test

import (
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/boxcar-run/boxcar/internal/config"
	"github.com/boxcar-run/boxcar/internal/job"
	"github.com/boxcar-run/boxcar/internal/queue"
)

// TestSweepKeepsTheLetterOfARejectedMessageWithoutAJobID: a worker of team-b rejected a message
// whose subject names no valid job id (boxcar.jobs.team-b.NOT-AN-ID), its status recorded under
// the message's sequence (stream-seq-N), and stopped before its letter; setup had retired
// team-b meanwhile. The sweep of a worker of the new config lettered it tenant_retired, with
// the sweep's error, without reading that status: the job's one letter told another end than
// its status, as the sweep did for a job with an id (TestSweepKeepsAnEndedJobsDeadLetter). It
// reads the status under the sequence, and the letter is the end's.
func TestSweepKeepsTheLetterOfARejectedMessageWithoutAJobID(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := t.Context()
	old := b.open(t, b.cfg, map[string]config.Tenant{"team-b": {}}, nil)
	if _, err := b.js.Publish(ctx, b.cfg.Subject+".team-b.NOT-AN-ID", []byte(`{"task":"t"}`), jetstream.WithExpectStream(queue.JobStream(b.cfg, "team-b"))); err != nil {
		t.Fatal(err)
	}
	d := fetch(t, old, 10*time.Second)
	b.declare(t, map[string]config.Tenant{"team-a": {}})
	fresh := b.open(t, b.cfg, map[string]config.Tenant{"team-a": {}}, nil)
	at := queue.Ref{Tenant: "team-b", ID: job.SeqID(d.Seq)}
	if _, err := old.UpdateStatus(ctx, at, func(st *job.Status) {
		st.State, st.Attempt, st.Error = job.StateRejected, d.Attempt, "the run's own error"
	}, queue.OnlyNew); err != nil {
		t.Fatal(err)
	}
	sweepRetired(t, b, fresh, "team-b")
	dl := b.deadLetter(t, d.Ref())
	if dl.Reason != "rejected" || dl.Error != "the run's own error" {
		t.Errorf("the rejected message's dead letter: reason %s, error %q; want reason rejected and the status's error", dl.Reason, dl.Error)
	}
}
