package queue_test

import (
	"encoding/json"
	"errors"
	"log/slog"
	"slices"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/boxcar-run/boxcar/internal/config"
	"github.com/boxcar-run/boxcar/internal/job"
	"github.com/boxcar-run/boxcar/internal/queue"
	"github.com/boxcar-run/boxcar/test/harness"
)

// TestApprovalsMoveToTenantBuckets is an upgrade from one approvals bucket for every tenant,
// with the generated permissions: a request an older worker asked in the shared bucket, still
// pending, is read and answered there by the tenant's approver (by its key alone), where that
// worker watches for the answer; `worker setup` copies the answered requests into their
// tenants' buckets, no other tenant's, and leaves the pending one; a worker of this version
// that asks again about a command answered before finds the answer.
func TestApprovalsMoveToTenantBuckets(t *testing.T) {
	t.Parallel()
	cfg, conn := tenancyServer(t)
	ctx := t.Context()
	op := jetStream(t, conn("operator"))
	if _, err := op.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: cfg.ApprovalsBucket}); err != nil {
		t.Fatal(err)
	}
	shared, err := jetStream(t, conn("worker")).KeyValue(ctx, cfg.ApprovalsBucket)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now().UTC()
	older := func(tenant string, d job.Decision) string { // what an older worker asks, and what was answered
		t.Helper()
		id := job.NewID()
		a := queue.Approval{Tenant: tenant, JobID: id, CallID: "call-1", Argv: []string{"rm", "x"}, RequestedAt: now, ExpiresAt: now.Add(time.Hour), Decision: d}
		data, err := json.Marshal(a)
		if err == nil {
			_, err = shared.Put(ctx, tenant+"."+id+".call-1", data)
		}
		if err != nil {
			t.Fatal(err)
		}
		return id
	}
	pending, answered, other := older("team-a", ""), older("team-a", job.DecisionApproved), older("team-b", job.DecisionDenied)
	tenants := map[string]config.Tenant{"team-a": {Profiles: []string{"p"}}, "team-b": {Profiles: []string{"p"}}}
	admin, err := queue.NewAdmin(conn("operator"), cfg, tenants, slog.New(slog.DiscardHandler))
	if err == nil {
		err = admin.Declare(ctx)
	}
	if err != nil {
		t.Fatalf("worker setup: %v", err)
	}

	approver := queueClient(ctx, t, conn("team-a-approver"), cfg, "team-a")
	shown, err := approver.Approval(ctx, pending, "call-1")
	if err != nil || shown.Decision != "" {
		t.Fatalf("team-a's approver reads the older worker's request: %+v, %v; want it pending", shown, err)
	}
	if _, err := approver.DecideApproval(ctx, pending, "call-1", shown.Revision, job.DecisionApproved, "ann", "", nil); err != nil {
		t.Fatalf("team-a's approver answers the older worker's request: %v", err)
	}
	if e, err := shared.Get(ctx, "team-a."+pending+".call-1"); err != nil || !json.Valid(e.Value()) || !answeredIn(e.Value()) {
		t.Errorf("the older worker's key holds no answer: %v", err)
	}
	if _, err := approver.Approval(ctx, other, "call-1"); !errors.Is(err, queue.ErrUnknownApproval) {
		t.Errorf("team-a's approver reads team-b's request: %v, want unknown", err)
	}

	for tenant, want := range map[string][]string{"team-a": {"team-a." + answered + ".call-1"}, "team-b": {"team-b." + other + ".call-1"}} {
		kv, err := op.KeyValue(ctx, queue.ApprovalsBucket(cfg, tenant))
		if err != nil {
			t.Fatal(err)
		}
		keys, err := kv.Keys(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(keys, want) {
			t.Errorf("%s's approvals bucket holds %v after setup, want %v (the answered request, not the pending one)", tenant, keys, want)
		}
	}

	w, err := queue.NewConsumer(ctx, conn("worker"), cfg, tenants, slog.New(slog.DiscardHandler), nil)
	if err != nil {
		t.Fatal(err)
	}
	again, err := w.RequestApproval(ctx, queue.Approval{Tenant: "team-a", JobID: pending, CallID: "call-1", Argv: []string{"rm", "x"}, RequestedAt: now, ExpiresAt: now.Add(time.Hour)})
	if err != nil || again.Decision != job.DecisionApproved {
		t.Errorf("a worker of this version asks again about the command answered in the shared bucket: %+v, %v; want the answer", again, err)
	}
}

func answeredIn(data []byte) bool {
	var a queue.Approval
	return json.Unmarshal(data, &a) == nil && a.Decision == job.DecisionApproved && a.DecidedBy == "ann"
}

// TestApprovalWaitsForASharedBucketThatAnswersNobody: a worker of this version asking a
// person about a command looks first in the shared approvals bucket, where an older worker of
// an upgrade may have asked about it and been answered. While that bucket's stream answered
// nobody (its server restarting) the request failed at once, and the command was denied to the
// model ("approval failed"), where before the change it was asked: the request now waits for
// the bucket within the approval's time, and then finds the answer given there.
func TestApprovalWaitsForASharedBucketThatAnswersNobody(t *testing.T) {
	t.Parallel()
	u := newUpgrade(t, true)
	ctx, cfg := u.ctx, u.cfg
	shared := u.olderBucket(t, cfg.ApprovalsBucket, 1)
	b := start(t, u.nc, cfg)
	now := time.Now().UTC()
	asked := queue.Approval{Tenant: tenant, JobID: job.NewID(), CallID: "call-1", Argv: []string{"rm", "x"}, RequestedAt: now, ExpiresAt: now.Add(time.Hour)}
	answered := asked
	answered.Decision, answered.DecidedBy = job.DecisionApproved, "ann"
	data, err := json.Marshal(answered)
	if err == nil {
		_, err = shared.Put(ctx, tenant+"."+asked.JobID+".call-1", data)
	}
	if err != nil {
		t.Fatal(err)
	}
	name := "KV_" + cfg.ApprovalsBucket
	answer := u.silence(t, name)
	// The worker asks the stream's info once its direct get went unanswered.
	looked, err := u.nc.SubscribeSync("$JS.API.STREAM.INFO." + name)
	if err != nil {
		t.Fatal(err)
	}
	type result struct {
		a   queue.Approval
		err error
	}
	done := make(chan result, 1)
	go func() {
		a, err := b.w.RequestApproval(ctx, asked)
		done <- result{a, err}
	}()
	if _, err := looked.NextMsg(harness.Timeout(20 * time.Second)); err != nil {
		t.Fatalf("the worker never looked the silent stream up: %v", err)
	}
	answer()
	got := <-done
	if got.err != nil || got.a.Decision != job.DecisionApproved {
		t.Errorf("asking while the shared bucket answered nobody: %+v, %v; want the answer given there", got.a, got.err)
	}
}
