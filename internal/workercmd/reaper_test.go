package workercmd

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/boxcar-run/boxcar/internal/config"
	"github.com/boxcar-run/boxcar/internal/job"
	"github.com/boxcar-run/boxcar/internal/queue"
	"github.com/boxcar-run/boxcar/internal/queue/queuetest"
	"github.com/boxcar-run/boxcar/internal/sandbox"
)

// TestReaperJudgesOnlyItsOwnTenants: a worker's reaper decides whether another worker still
// holds a pod's job by reading that job's status, which it can read only in the tenants it
// serves. Workers of one release whose tenant lists differ exist at every rolling upgrade that
// adds or removes a tenant (the old replicas keep running, and reaping, until the rollout
// replaces them): a job of a tenant the reaper does not serve must not look gone, or an old
// replica deletes the sandbox pod of every job of the new tenant that a new replica runs. A
// pod that names no tenant (one an older worker started or claimed) is spared unless
// its job is found in a tenant the reaper serves.
func TestReaperJudgesOnlyItsOwnTenants(t *testing.T) {
	t.Parallel()
	_, nc := queuetest.Connect(t, queue.EmbeddedOptions{})
	cfg := config.Config{}.WithDefaults()
	grant := config.Tenant{Profiles: []string{"p"}, MaxConcurrent: 4}
	after := map[string]config.Tenant{"team-a": grant, "team-c": grant} // the upgrade adds team-c
	before := map[string]config.Tenant{"team-a": grant}
	log := slog.New(slog.DiscardHandler)
	admin, err := queue.NewAdmin(nc, cfg.NATS, after, log)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	if err := admin.Declare(ctx); err != nil {
		t.Fatal(err)
	}
	newWorker, err := queue.Open(ctx, nc, cfg.NATS, after, log)
	if err != nil {
		t.Fatal(err)
	}
	oldWorker, err := queue.Open(ctx, nc, cfg.NATS, before, log)
	if err != nil {
		t.Fatal(err)
	}
	// The new replica runs team-c's job, and team-a's ended: their statuses say so, as the
	// runner writes them.
	status := func(tenant, id string, state job.State) {
		t.Helper()
		if _, err := newWorker.UpdateNewStatus(ctx, queue.Ref{Tenant: tenant, ID: id}, func(s *job.Status) {
			s.State, s.Worker, s.Attempt, s.Profile = state, "worker-new", 1, "p"
		}); err != nil {
			t.Fatal(err)
		}
	}
	const running, ended = "job-of-team-c-1", "job-of-team-a-1"
	status("team-c", running, job.StateRunning)
	status("team-a", ended, job.StateSucceeded)
	for _, tt := range []struct {
		name   string
		reaper *queue.Consumer
		pod    sandbox.PodJob
		held   bool
	}{
		{name: "a replica serving the tenant sees its running job", reaper: newWorker,
			pod: sandbox.PodJob{JobID: running, Tenant: "team-c", Worker: "worker-new"}, held: true},
		{name: "a replica not serving the tenant spares its pod", reaper: oldWorker,
			pod: sandbox.PodJob{JobID: running, Tenant: "team-c", Worker: "worker-new"}, held: true},
		{name: "a pod naming no tenant whose job is in none of the reaper's is spared", reaper: oldWorker,
			pod: sandbox.PodJob{JobID: running, Worker: "worker-new"}, held: true},
		{name: "a pod naming no tenant is judged where the reaper finds its job", reaper: newWorker,
			pod: sandbox.PodJob{JobID: running, Worker: "worker-new"}, held: true},
		{name: "a served tenant's ended job is not held", reaper: oldWorker,
			pod: sandbox.PodJob{JobID: ended, Tenant: "team-a", Worker: "worker-new"}},
		{name: "an ended job found without the tenant is not held", reaper: oldWorker,
			pod: sandbox.PodJob{JobID: ended, Worker: "worker-new"}},
		{name: "a served tenant's unknown job is not held", reaper: oldWorker,
			pod: sandbox.PodJob{JobID: "job-never-1", Tenant: "team-a", Worker: "worker-new"}},
	} {
		if got := heldBy(ctx, "worker-reaper", nil, tt.reaper)(tt.pod); got != tt.held {
			t.Errorf("%s: held %v, want %v (the reaper serves %v)", tt.name, got, tt.held, tt.reaper.Tenants())
		}
	}
}
