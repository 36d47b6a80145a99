package queue_test

import (
	"bytes"
	"errors"
	"log/slog"
	"strings"
	"testing"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/boxcar-run/boxcar/internal/config"
	"github.com/boxcar-run/boxcar/internal/job"
	"github.com/boxcar-run/boxcar/internal/queue"
)

// TestSetupLeavesAJobWhoseStatusItCannotRead: `worker setup` retiring a tenant leaves the jobs
// a worker runs; one whose running status is in the shared status bucket (an older worker's,
// during an upgrade) while that bucket's stream answers nobody (its leader being elected) was
// taken as not running: dead-lettered as unknown_tenant and removed from its stream while its
// worker ran it, the job ended twice. A status setup cannot read now leaves the job, which the
// next setup retires once it can tell, and says so.
func TestSetupLeavesAJobWhoseStatusItCannotRead(t *testing.T) {
	t.Parallel()
	u := newUpgrade(t, true)
	ctx, cfg := u.ctx, u.cfg
	shared := u.olderBucket(t, cfg.StatusBucket, 1)
	var log bytes.Buffer
	declare := func(tenants map[string]config.Tenant) {
		t.Helper()
		admin, err := queue.NewAdmin(u.nc, cfg, tenants, slog.New(slog.NewTextHandler(&log, nil)))
		if err == nil {
			err = admin.Declare(ctx)
		}
		if err != nil {
			t.Fatalf("worker setup: %v", err)
		}
	}
	declare(map[string]config.Tenant{"team-a": {}, "team-b": {}})
	b := bundle{nc: u.nc, js: u.js, cfg: cfg}
	j := newJob(t)
	if _, err := b.client(t, "team-b").Publish(ctx, j); err != nil {
		t.Fatal(err)
	}
	if _, err := shared.Put(ctx, "team-b."+j.ID, mustMarshal(t, job.Status{ID: j.ID, State: job.StateRunning, Attempt: 1})); err != nil {
		t.Fatal(err)
	}

	answer := u.silence(t, "KV_"+cfg.StatusBucket)
	declare(map[string]config.Tenant{"team-a": {}}) // team-b retired
	answer()
	r := queue.Ref{Tenant: "team-b", ID: j.ID}
	if _, err := queue.DeadLetterOf(ctx, u.nc, cfg, r); !errors.Is(err, jetstream.ErrMsgNotFound) {
		t.Errorf("the running job's dead letter after a setup that could not read its status: %v; want none", err)
	}
	s, err := u.js.Stream(ctx, queue.JobStream(cfg, "team-b"))
	if err != nil || s.CachedInfo().State.Msgs != 1 {
		t.Fatalf("team-b's stream after that setup: %v; want it holding the running job", err)
	}
	if !strings.Contains(log.String(), "cannot tell whether a job of a tenant the config does not list runs") {
		t.Errorf("setup does not say it left the job:\n%s", log.String())
	}
}
