package runner_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/boxcar-run/boxcar/internal/job"
	"github.com/boxcar-run/boxcar/internal/store/storetest"
)

// TestReadOnlyFileStoreWaitsNotReady: a file store whose directory refuses the worker's writes
// (made read-only here: storetest.ReadOnly) refuses every tenant: the job waits
// for the store with its delivery, as for an outage, and runs once the directory takes writes
// again. Before, the tenant's proof of writes met the refusal first and failed the job
// store_write_refused at its first delivery.
func TestReadOnlyFileStoreWaitsNotReady(t *testing.T) {
	t.Parallel()
	b := setup(t)
	dir := strings.TrimPrefix(b.shared.URL(""), "file://")
	j := b.newJob("p", "t") // its input stored before the directory refuses writes
	lift := storetest.ReadOnly(t, dir)
	b.worker(agentFunc(writeReport))
	b.publish(j)
	var st job.Status
	waitFor(t, time.Minute, "the status to say the attempt waits for the store", func() bool {
		var err error
		st, err = b.q.Status(context.Background(), j.ID)
		return err == nil && strings.HasPrefix(st.Error, "waiting for the store") || st.State.Terminal()
	})
	if st.State.Terminal() {
		t.Fatalf("job ended %s (%q) while the store's directory refused the worker; want it waiting", st.State, st.Error)
	}
	lift()
	if st = b.waitFinal(j.ID, 2*time.Minute); st.State != job.StateSucceeded || st.Attempt != 1 {
		t.Errorf("job ended %s at attempt %d (%q), want succeeded at the first once the directory takes writes", st.State, st.Attempt, st.Error)
	}
}
