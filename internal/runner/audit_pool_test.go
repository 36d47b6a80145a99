package runner_test

import (
	"context"
	"testing"
	"time"

	"github.com/boxcar-run/boxcar/internal/agent"
	"github.com/boxcar-run/boxcar/internal/job"
	"github.com/boxcar-run/boxcar/internal/runner"
	"github.com/boxcar-run/boxcar/internal/sandbox"
)

// blockedPool is a pool whose Take waits until its job's context ends: a sandbox being started.
type blockedPool struct{ taking chan struct{} }

func (p *blockedPool) Take(ctx context.Context, _, _, _ string, _ sandbox.Spec) (sandbox.Sandbox, bool, error) {
	select {
	case p.taking <- struct{}{}:
	default:
	}
	<-ctx.Done()
	return nil, false, ctx.Err()
}

// TestAuditPoolStatusSandboxIsTheRunningAttempts: the status's sandbox_claimed_at and
// sandbox_warm say "when the running attempt had its sandbox" and whether it was warm
// (internal/job/status.go). An attempt 2 still waiting for its sandbox must not show attempt
// 1's warm sandbox and claim time as its own; `submit status` prints them as the sandbox line.
func TestAuditPoolStatusSandboxIsTheRunningAttempts(t *testing.T) {
	t.Parallel()
	b := setup(t)
	// Attempt 1: a warm sandbox, a progress write (which records the claim), then the worker dies.
	started := make(chan struct{}, 1)
	first := &fakePool{warm: 1}
	dying := b.worker(agentFunc(func(ctx context.Context, req agent.Request) (agent.Result, error) {
		req.Progress(agent.Event{Kind: agent.EventModelRequest, Turn: 1, MaxToolCalls: 30, Spent: agent.Budget{Turns: 1}})
		started <- struct{}{}
		<-ctx.Done()
		return agent.Result{}, ctx.Err()
	}), func(c *runner.Config) { c.Pool = first })
	first.p = dying.p
	j := b.submit("p")
	<-started
	waitFor(t, 10*time.Second, "attempt 1's status to record its warm sandbox", func() bool {
		st, err := b.q.Status(context.Background(), j.ID)
		return err == nil && st.SandboxWarm
	})
	dying.nc.Close()
	dying.stop()

	// Attempt 2: its sandbox is still being started.
	second := &blockedPool{taking: make(chan struct{}, 1)}
	b.worker(agentFunc(writeReport), func(c *runner.Config) { c.Pool = second })
	select {
	case <-second.taking:
	case <-time.After(30 * time.Second):
		t.Fatal("attempt 2 never asked for its sandbox")
	}
	var st job.Status
	waitFor(t, 10*time.Second, "attempt 2 running", func() bool {
		var err error
		st, err = b.q.Status(context.Background(), j.ID)
		return err == nil && st.Attempt == 2 && st.State == job.StateRunning
	})
	if st.SandboxWarm || !st.SandboxClaimedAt.IsZero() {
		t.Errorf("attempt 2, still %q, shows sandbox warm %v claimed at %v: attempt 1's sandbox", st.Progress, st.SandboxWarm, st.SandboxClaimedAt)
	}
}
