package queue_test

import (
	"testing"

	"github.com/boxcar-run/boxcar/internal/config"
	"github.com/boxcar-run/boxcar/internal/job"
	"github.com/boxcar-run/boxcar/internal/queue"
)

// TestSweepKeepsAnEndedJobsDeadLetter: a worker of team-b ran a job that setup left to its run
// when it retired team-b; the run ended failed or rejected, its worker wrote the status and
// stopped before the letter. The sweep of a worker of the new config found the job ended and
// acked its message, and the job had no dead letter, never to be replayed. An end that carries
// a letter keeps it: the sweep writes it, once, with the status's reason and error, and then
// removes the message.
func TestSweepKeepsAnEndedJobsDeadLetter(t *testing.T) {
	t.Parallel()
	for _, row := range []struct {
		state  job.State
		reason string
	}{
		{job.StateFailed, "failed"},
		{job.StateRejected, "rejected"},
		{job.StateDead, "max_deliveries"},
	} {
		t.Run(string(row.state), func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			ctx := t.Context()
			old, j, d := b.fetchedByOldWorker(t)
			state := func(s job.State, why string) {
				t.Helper()
				if _, err := old.UpdateStatus(ctx, d.Ref(), func(st *job.Status) { st.State, st.Attempt, st.Error = s, d.Attempt, why }, queue.ByAttempt(d.Attempt)); err != nil {
					t.Fatal(err)
				}
			}
			state(job.StateRunning, "")
			b.declare(t, map[string]config.Tenant{"team-a": {}})
			fresh := b.open(t, b.cfg, map[string]config.Tenant{"team-a": {}}, nil)
			state(row.state, "the run's own error")
			sweepRetired(t, b, fresh, "team-b")
			own := queue.DeadLetterStream(b.cfg, "team-b")
			if letters := lettersOf(t, b, j.ID, own, b.cfg.DeadLetterStream); len(letters) != 1 || letters[0] != own+"."+j.ID+"×1" {
				t.Fatalf("the %s job's dead letters: %v; want one, in %s", row.state, letters, own)
			}
			dl := b.deadLetter(t, d.Ref())
			if dl.Reason != row.reason || dl.Error != "the run's own error" || dl.JobID != j.ID {
				t.Errorf("the %s job's dead letter: %+v; want reason %s and the status's error", row.state, dl, row.reason)
			}
			if s, err := b.js.Stream(ctx, queue.JobStream(b.cfg, "team-b")); err == nil && s.CachedInfo().State.Msgs != 0 {
				t.Errorf("team-b's job stream holds %d messages; want the job's removed", s.CachedInfo().State.Msgs)
			}
		})
	}
}
