package runner_test

import (
	"context"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/boxcar-run/boxcar/internal/job"
	"github.com/boxcar-run/boxcar/internal/runner"
	"github.com/boxcar-run/boxcar/internal/sandbox"
)

// slowStartProvider is a backend whose sandbox takes long to start (a pod pulling its image):
// Start returns only when its context ends.
type slowStartProvider struct {
	fakeProvider
	starting chan struct{}
}

func (p *slowStartProvider) Start(ctx context.Context, spec sandbox.Spec) (sandbox.Sandbox, error) {
	p.starting <- struct{}{}
	<-ctx.Done()
	return nil, context.Cause(ctx)
}

// TestAuditCancelledStartIsNoSandboxFailure: a user cancels a job while its sandbox starts.
// The backend did nothing wrong, yet boxcar_sandbox_failures_total{stage="start"} counts it,
// and the chart's BoxcarSandboxStartFailures alert (failures over failures plus starts) reads
// cancellations as a failing backend. The same goes for a start cut short by the drain.
func TestAuditCancelledStartIsNoSandboxFailure(t *testing.T) {
	t.Parallel()
	b := setup(t)
	p := &slowStartProvider{starting: make(chan struct{}, 1)}
	w := b.worker(agentFunc(writeReport), func(c *runner.Config) { c.Sandboxes = p })
	j := b.submit("p")
	select {
	case <-p.starting:
	case <-time.After(30 * time.Second):
		t.Fatal("the sandbox never began to start")
	}
	if _, err := b.q.Cancel(context.Background(), j.ID, "tester"); err != nil {
		t.Fatal(err)
	}
	if st := b.waitFinal(j.ID, 20*time.Second); st.State != job.StateCancelled {
		t.Fatalf("the job ended %s: %s, want cancelled", st.State, st.Error)
	}
	w.stop()
	if got := testutil.ToFloat64(w.m.SandboxFailed.WithLabelValues("fake", "start")); got != 0 {
		t.Errorf("boxcar_sandbox_failures_total{backend=\"fake\",stage=\"start\"} = %v after a job cancelled while its sandbox started; want 0 (the backend did not fail)", got)
	}
}
