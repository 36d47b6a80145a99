package runner_test

import (
	"context"
	"strings"
	"time"

	"github.com/boxcar-run/boxcar/internal/job"
)

// waitsForTheStore publishes j to a new worker and holds that its attempt waits for the store
// with its delivery, as for an outage, while what refuses the worker lasts (while says what),
// and that the job succeeds at its first attempt once lift has lifted it.
func (b *bundle) waitsForTheStore(j job.Job, while string, lift func()) {
	b.t.Helper()
	b.worker(agentFunc(writeReport))
	b.publish(j)
	var st job.Status
	waitFor(b.t, time.Minute, "the status to say the attempt waits for the store", func() bool {
		var err error
		st, err = b.q.Status(context.Background(), j.ID)
		return err == nil && strings.HasPrefix(st.Error, "waiting for the store") || st.State.Terminal()
	})
	if st.State.Terminal() {
		b.t.Fatalf("job ended %s (%q) while %s; want it waiting", st.State, st.Error, while)
	}
	lift()
	if st = b.waitFinal(j.ID, 2*time.Minute); st.State != job.StateSucceeded || st.Attempt != 1 {
		b.t.Errorf("job ended %s at attempt %d (%q), want succeeded at the first once that is lifted (%s)", st.State, st.Attempt, st.Error, while)
	}
}
