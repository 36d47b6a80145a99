package queue_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/boxcar-run/boxcar/internal/config"
	"github.com/boxcar-run/boxcar/internal/job"
	"github.com/boxcar-run/boxcar/internal/queue"
	"github.com/boxcar-run/boxcar/internal/queue/queuetest"
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

// TestSetupRidesOutASharedBucketThatDoesNotAnswer: `worker setup` retiring team-b, whose queued
// job's status is in team-b's own bucket, while the shared status bucket's look-up fails (here
// the server refuses it until the test sees it asked, and then takes the refusal back, as a
// stream whose leader is elected answers again). Setup looked the shared bucket up before any
// job needed it, and its one failed look-up failed the whole setup, every tenant's; it now asks
// the shared bucket only for a job whose status is not in its tenant's, and asks a look-up
// that fails again for a few seconds.
func TestSetupRidesOutASharedBucketThatDoesNotAnswer(t *testing.T) {
	t.Parallel()
	cfg := config.Config{}.WithDefaults().NATS
	info := "$JS.API.STREAM.INFO.KV_" + cfg.StatusBucket
	opts := &server.Options{ServerName: "boxcar-setup", Host: "127.0.0.1", Port: -1, NoSigs: true, NoLog: true,
		JetStream: true, StoreDir: t.TempDir(), JetStreamMaxStore: queuetest.MaxStore}
	users := func(deny ...string) []*server.User {
		return []*server.User{{Username: "setup", Password: "setup-pw", Permissions: &server.Permissions{
			Publish: &server.SubjectPermission{Allow: []string{">"}, Deny: deny}}}, {Username: "op", Password: "op-pw"}}
	}
	opts.Users = users(info)
	ns, err := server.NewServer(opts)
	if err != nil {
		t.Fatal(err)
	}
	go ns.Start()
	t.Cleanup(func() { ns.Shutdown(); ns.WaitForShutdown() })
	if !ns.ReadyForConnections(20 * time.Second) {
		t.Fatal("nats-server did not start")
	}
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	conn := func(user string) *nats.Conn {
		nc, err := queue.Connect(ctx, queue.ConnOptions{URL: ns.ClientURL(), Name: "test-" + user, User: user, Password: user + "-pw"})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(nc.Close)
		return nc
	}
	op, setup := conn("op"), conn("setup")
	declare := func(nc *nats.Conn, tenants map[string]config.Tenant) error {
		admin, err := queue.NewAdmin(nc, cfg, tenants, slog.New(slog.DiscardHandler))
		if err != nil {
			return err
		}
		return admin.Declare(ctx)
	}
	if err := declare(op, map[string]config.Tenant{"team-a": {}, "team-b": {}}); err != nil {
		t.Fatal(err)
	}
	u := upgrade{ctx: ctx, nc: op, js: jetStream(t, op), cfg: cfg}
	u.olderBucket(t, cfg.StatusBucket, 1)
	b := bundle{nc: op, js: u.js, cfg: cfg}
	j := newJob(t)
	if _, err := b.client(t, "team-b").Publish(ctx, j); err != nil {
		t.Fatal(err)
	}
	own, err := u.js.KeyValue(ctx, queue.StatusBucket(cfg, "team-b"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := own.Put(ctx, "team-b."+j.ID, mustMarshal(t, job.Status{ID: j.ID, State: job.StateQueued})); err != nil {
		t.Fatal(err)
	}

	answers := make(chan error, 1)
	go func() { // the look-up answers again once setup was refused it
		for !errors.Is(setup.LastError(), nats.ErrPermissionViolation) {
			select {
			case <-ctx.Done():
				answers <- ctx.Err()
				return
			case <-time.After(20 * time.Millisecond):
			}
		}
		next := opts.Clone()
		next.Users = users()
		answers <- ns.ReloadOptions(next)
	}()
	if err := declare(setup, map[string]config.Tenant{"team-a": {}}); err != nil { // team-b retired
		t.Errorf("worker setup while the shared status bucket's look-up failed a moment: %v", err)
	}
	if err := <-answers; err != nil {
		t.Fatal(err)
	}
	dl, err := queue.DeadLetterOf(ctx, op, cfg, queue.Ref{Tenant: "team-b", ID: j.ID})
	if err != nil || !strings.Contains(string(dl), queue.ReasonUnknownTenant) {
		t.Errorf("team-b's queued job after its retirement: %s, %v; want it dead-lettered %s", dl, err, queue.ReasonUnknownTenant)
	}
}

// TestSetupLeavesJobsWhoseLetterItCannotWrite: `worker setup` retires team-b and team-c while
// team-b's dead-letter stream is there and answers nobody (its leader being elected; here its
// subjects taken away). Setup writes a retired tenant's letters where its workers do, so it
// waits for that stream, and past a few seconds it failed, team-c's retirement undone with it.
// It now leaves team-b's jobs in their stream, says so, retires team-c, and the next setup
// retires team-b once its stream answers.
func TestSetupLeavesJobsWhoseLetterItCannotWrite(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	b.declare(t, map[string]config.Tenant{"team-a": {}, "team-b": {}, "team-c": {}})
	jobs := map[string]job.Job{}
	for _, tenant := range []string{"team-b", "team-c"} {
		jobs[tenant] = newJob(t)
		if _, err := b.client(t, tenant).Publish(ctx, jobs[tenant]); err != nil {
			t.Fatal(err)
		}
	}
	name := queue.DeadLetterStream(b.cfg, "team-b")
	answering := streamConfig(t, b.js, name)
	away := answering
	away.Subjects = []string{name + "-away.>"}
	if _, err := b.js.UpdateStream(ctx, away); err != nil {
		t.Fatal(err)
	}
	var log bytes.Buffer
	admin, err := queue.NewAdmin(b.nc, b.cfg, map[string]config.Tenant{"team-a": {}}, slog.New(slog.NewTextHandler(&log, nil)))
	if err != nil {
		t.Fatal(err)
	}
	if err := admin.Declare(ctx); err != nil {
		t.Errorf("worker setup while team-b's dead-letter stream answers nobody: %v", err)
	}
	if !strings.Contains(log.String(), "cannot dead-letter the jobs of a tenant the config does not list") {
		t.Errorf("setup does not say it left team-b's job:\n%s", log.String())
	}
	if dl := b.deadLetterOf(t, "team-c", jobs["team-c"].ID); dl.Reason != queue.ReasonUnknownTenant {
		t.Errorf("team-c's job: %+v; want it dead-lettered %s", dl, queue.ReasonUnknownTenant)
	}
	if s, err := b.js.Stream(ctx, queue.JobStream(b.cfg, "team-b")); err != nil || s.CachedInfo().State.Msgs != 1 {
		t.Fatalf("team-b's job stream: %v; want it holding the job", err)
	}

	if _, err := b.js.UpdateStream(ctx, answering); err != nil {
		t.Fatal(err)
	}
	b.declare(t, map[string]config.Tenant{"team-a": {}})
	if dl := b.deadLetterOf(t, "team-b", jobs["team-b"].ID); dl.Reason != queue.ReasonUnknownTenant {
		t.Errorf("team-b's job after the next setup: %+v; want it dead-lettered %s", dl, queue.ReasonUnknownTenant)
	}
}

// deadLetterOf is the dead letter of tenant's job id; it fails t when there is none.
func (b bundle) deadLetterOf(t *testing.T, tenant, id string) queue.DeadLetter {
	t.Helper()
	data, err := queue.DeadLetterOf(t.Context(), b.nc, b.cfg, queue.Ref{Tenant: tenant, ID: id})
	if err != nil {
		t.Fatalf("no dead letter of %s's job %s: %v", tenant, id, err)
	}
	var dl queue.DeadLetter
	if err := json.Unmarshal(data, &dl); err != nil {
		t.Fatal(err)
	}
	return dl
}

// TestSetupLeavesAJobAnOlderWorkerClaimedAfterItsRead: during an upgrade, `worker setup`
// retiring team-b read a queued job's status (none in team-b's bucket, none in the shared one),
// and an older worker, which writes the shared status bucket alone, claimed the job before
// setup wrote its end. Setup's compare-and-set was on team-b's own bucket only, where the older
// worker wrote nothing: it ended the job dead, dead-lettered and removed it while the older
// worker ran it, and its status read dead. The end is now also a compare-and-set of the shared
// bucket's key at the revision setup read there, which the older worker's claim makes fail.
func TestSetupLeavesAJobAnOlderWorkerClaimedAfterItsRead(t *testing.T) {
	t.Parallel()
	u := newUpgrade(t, false)
	ctx, cfg := u.ctx, u.cfg
	shared := u.olderBucket(t, cfg.StatusBucket, 1)
	declare := func(tenants map[string]config.Tenant, afterHeld func(queue.Ref)) {
		t.Helper()
		admin, err := queue.NewAdmin(u.nc, cfg, tenants, slog.New(slog.DiscardHandler))
		if err != nil {
			t.Fatal(err)
		}
		if afterHeld != nil {
			admin.AfterHeldRead(afterHeld)
		}
		if err := admin.Declare(ctx); err != nil {
			t.Fatalf("worker setup: %v", err)
		}
	}
	declare(map[string]config.Tenant{"team-a": {}, "team-b": {}}, nil)
	b := bundle{nc: u.nc, js: u.js, cfg: cfg}
	j := newJob(t)
	if _, err := b.client(t, "team-b").Publish(ctx, j); err != nil {
		t.Fatal(err)
	}
	claimed := false
	declare(map[string]config.Tenant{"team-a": {}}, func(r queue.Ref) { // team-b retired
		if claimed || r.ID != j.ID {
			return
		}
		// The older worker's claim: a create of the job's key in the shared bucket.
		if _, err := shared.Create(ctx, "team-b."+j.ID, mustMarshal(t, job.Status{ID: j.ID, State: job.StateRunning, Attempt: 1})); err != nil {
			t.Errorf("the older worker's claim: %v", err)
		}
		claimed = true
	})
	if !claimed {
		t.Fatal("setup never came to the job")
	}
	r := queue.Ref{Tenant: "team-b", ID: j.ID}
	if _, err := queue.DeadLetterOf(ctx, u.nc, cfg, r); !errors.Is(err, jetstream.ErrMsgNotFound) {
		t.Errorf("the job the older worker claimed has a dead letter (%v); want none, the job left to its run", err)
	}
	if s, err := u.js.Stream(ctx, queue.JobStream(cfg, "team-b")); err != nil || s.CachedInfo().State.Msgs != 1 {
		t.Errorf("team-b's stream after setup: %v; want it holding the job the older worker runs", err)
	}
	own, err := u.js.KeyValue(ctx, queue.StatusBucket(cfg, "team-b"))
	if err != nil {
		t.Fatal(err)
	}
	if e, err := own.Get(ctx, "team-b."+j.ID); !errors.Is(err, jetstream.ErrKeyNotFound) {
		t.Errorf("team-b's bucket holds a status of the job the older worker runs (%v), which readers take over the shared one's; want none", err)
		if err == nil {
			t.Logf("it says %s", e.Value())
		}
	}
}
