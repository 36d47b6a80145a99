package runner_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/boxcar-run/boxcar/internal/agent"
	"github.com/boxcar-run/boxcar/internal/job"
	"github.com/boxcar-run/boxcar/internal/queue"
)

// TestStaleClaimLeavesTheJobToTheLaterDelivery: a delivery that paused before its claim (past
// its ack wait, so that the server delivered the job again) claims after a later delivery
// did. Its claim's status write is held to its attempt, as every later write of an attempt is:
// it does not take the status back from the later delivery that runs the job (whose writes a
// stale attempt's would then pass) nor run the job beside it. Here the later delivery's
// claim is written by hand, as delivery 3's, before the worker gets delivery 1.
func TestStaleClaimLeavesTheJobToTheLaterDelivery(t *testing.T) {
	t.Parallel()
	b := setup(t)
	j := b.newJob("p", "t")
	r := queue.Ref{Tenant: job.DefaultTenant, ID: j.ID}
	_, q := b.connect()
	if _, err := q.UpdateStatus(context.Background(), r, func(s *job.Status) {
		s.State, s.Attempt, s.Worker = job.StateRunning, 3, "worker-later"
	}); err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var ranAt []int // the attempt the status names when the agent runs
	b.worker(agentFunc(func(ctx context.Context, req agent.Request) (agent.Result, error) {
		st, err := q.Status(ctx, r)
		mu.Lock()
		ranAt = append(ranAt, st.Attempt)
		mu.Unlock()
		if err != nil {
			t.Errorf("status: %v", err)
		}
		return writeReport(ctx, req)
	}))
	b.publish(j)
	final := b.waitFinal(j.ID, 60*time.Second)
	mu.Lock()
	defer mu.Unlock()
	if final.State != job.StateSucceeded || len(ranAt) != 1 || ranAt[0] != 3 {
		t.Errorf("the job ran under the status of attempts %v and ended %s at attempt %d; want one run, by delivery 3, which held the job", ranAt, final.State, final.Attempt)
	}
}
