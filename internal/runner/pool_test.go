package runner_test

import (
	"context"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/boxcar-run/boxcar/internal/agent"
	"github.com/boxcar-run/boxcar/internal/job"
	"github.com/boxcar-run/boxcar/internal/runner"
	"github.com/boxcar-run/boxcar/internal/sandbox"
)

// fakePool hands out the sandboxes it was given as warm, then starts cold ones.
type fakePool struct {
	p    *fakeProvider
	mu   sync.Mutex
	warm int
	took []string // tenant/job id, in order
}

func (f *fakePool) Take(ctx context.Context, tenant, profile, jobID string, spec sandbox.Spec) (sandbox.Sandbox, bool, error) {
	f.mu.Lock()
	warm := f.warm > 0
	if warm {
		f.warm--
	}
	f.took = append(f.took, tenant+"/"+jobID)
	f.mu.Unlock()
	sb, err := f.p.Start(ctx, spec)
	return sb, warm, err
}

// TestPoolSandboxRecordedInManifestAndStatus: a job whose sandbox came from the pool says so,
// with the claim time, in its manifest and its status; a cold one says warm false.
func TestPoolSandboxRecordedInManifestAndStatus(t *testing.T) {
	t.Parallel()
	b := setup(t)
	pool := &fakePool{warm: 1}
	w := b.worker(agentFunc(writeReport), func(c *runner.Config) { c.Pool = pool })
	pool.p = w.p
	var want []string
	for _, wantWarm := range []bool{true, false} {
		before := time.Now()
		j := b.submit("p")
		want = append(want, job.DefaultTenant+"/"+j.ID)
		st := b.waitFinal(j.ID, 10*time.Second)
		if st.State != job.StateSucceeded {
			t.Fatalf("status = %+v, want succeeded", st)
		}
		sb := b.manifest(j.ID).Predicate.Sandbox
		if sb.Warm != wantWarm || sb.ClaimedAt.Before(before) || sb.ClaimedAt.After(time.Now()) {
			t.Errorf("manifest sandbox warm %v claimed at %v; want warm %v, claimed during the run", sb.Warm, sb.ClaimedAt, wantWarm)
		}
		if !st.SandboxClaimedAt.Equal(sb.ClaimedAt) || st.SandboxWarm != wantWarm {
			t.Errorf("status sandbox claimed at %v warm %v; want the manifest's %v and %v", st.SandboxClaimedAt, st.SandboxWarm, sb.ClaimedAt, wantWarm)
		}
	}
	if !slices.Equal(pool.took, want) || w.p.started.Load() != 2 {
		t.Errorf("pool took %v, provider started %d; want both jobs through the pool, for their tenant: %v", pool.took, w.p.started.Load(), want)
	}
}

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

// TestRetriedStatusShowsItsOwnSandbox: the status's sandbox_claimed_at and sandbox_warm say
// when the running attempt had its sandbox and whether it was warm (job.Status), and `submit
// status` prints them as the sandbox line: an attempt 2 still waiting for its sandbox shows
// none, not attempt 1's warm one (the claim's write clears the attempt's fields,
// job.Status.ClearAttempt).
func TestRetriedStatusShowsItsOwnSandbox(t *testing.T) {
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
