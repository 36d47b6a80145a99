package workercmd

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/boxcar-run/boxcar/internal/config"
	"github.com/boxcar-run/boxcar/internal/job"
	"github.com/boxcar-run/boxcar/internal/queue"
)

// TestAuditK8sReaperJudgesOnlyItsOwnTenants: a worker's reaper decides whether another worker
// still holds a pod's job by reading that job's status in the tenants this worker serves
// (q.Tenants()), and a job of a tenant it does not serve looks unknown, so not held: the pod is
// deleted under the running job. Workers of one release whose tenant lists differ exist at
// every rolling upgrade that adds or removes a tenant (the old replicas keep running, and
// reaping, until the rollout replaces them): an old replica deletes, a minute after its start,
// the sandbox pod of every job of the new tenant that a new replica runs.
func TestAuditK8sReaperJudgesOnlyItsOwnTenants(t *testing.T) {
	t.Parallel()
	ns, err := queue.StartEmbedded(queue.EmbeddedOptions{Port: -1, StoreDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ns.Shutdown(); ns.WaitForShutdown() })
	nc, err := nats.Connect(ns.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
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
	// The new replica runs team-c's job: its status says so, as the runner writes it before
	// it starts the sandbox.
	const id = "job-of-team-c-1"
	if _, err := newWorker.UpdateNewStatus(ctx, queue.Ref{Tenant: "team-c", ID: id}, func(s *job.Status) {
		s.State, s.Worker, s.Attempt, s.Profile = job.StateRunning, "worker-new", 1, "p"
	}); err != nil {
		t.Fatal(err)
	}
	// The reaper of the new replica itself, and of an old one, judging the pod (job id, worker).
	if !heldBy(ctx, "worker-new-2", nil, newWorker)(id, "worker-new") {
		t.Fatal("a replica serving team-c does not see the job held either: the test is wrong")
	}
	if !heldBy(ctx, "worker-old", nil, oldWorker)(id, "worker-new") {
		t.Errorf("the old replica's reaper takes team-c's running job %s (held by worker-new) for gone and deletes its sandbox pod: it looks only in its own tenants %v", id, oldWorker.Tenants())
	}
}
