package runner_test

import (
	"context"
	"slices"
	"sync"
	"testing"
	"time"

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
