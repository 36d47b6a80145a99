package queue_test

import (
	"testing"

	"github.com/boxcar-run/boxcar/internal/config"
	"github.com/boxcar-run/boxcar/internal/job"
	"github.com/boxcar-run/boxcar/internal/queue"
)

// TestSetupKeepsAnEndedJobsDeadLetter: a worker of team-b ended a job failed or rejected,
// wrote its status and stopped before its letter; setup then retires team-b. Setup wrote the
// job an unknown_tenant letter, saying no worker serves team-b, where its status says how its
// run ended: the job's one letter told another end than its status. The letter is the end's,
// with the status's reason and error, as the worker would have written it.
func TestSetupKeepsAnEndedJobsDeadLetter(t *testing.T) {
	t.Parallel()
	for _, state := range []job.State{job.StateFailed, job.StateRejected} {
		t.Run(string(state), func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			old, j, d := b.fetchedByOldWorker(t)
			if _, err := old.UpdateStatus(t.Context(), d.Ref(), func(st *job.Status) { st.State, st.Attempt, st.Error = state, d.Attempt, "the run's own error" }, queue.ByAttempt(d.Attempt)); err != nil {
				t.Fatal(err)
			}
			b.declare(t, map[string]config.Tenant{"team-a": {}})
			dl := b.deadLetter(t, d.Ref())
			if dl.Reason != string(state) || dl.Error != "the run's own error" || dl.JobID != j.ID {
				t.Errorf("the %s job's dead letter: reason %s, error %q; want reason %s and the status's error", state, dl.Reason, dl.Error, state)
			}
		})
	}
}
