//go:build integration

package runner_test

import (
	"context"
	"log/slog"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/boxcar-run/boxcar/internal/agent"
	"github.com/boxcar-run/boxcar/internal/job"
	"github.com/boxcar-run/boxcar/internal/runner"
	"github.com/boxcar-run/boxcar/internal/store"
	"github.com/boxcar-run/boxcar/test/harness"
)

// TestInputReadRefusedFailsTheJob: on a real S3 server whose bucket policy refuses the
// worker's account reads of one input of the job (while it reads the store's own object), the
// job fails at its first delivery without running the agent, input_refused, and the worker's
// log names the permission to grant on the key. Before, the AccessDenied was waited out as an
// outage of the store until the attempt gave up, at every delivery.
func TestInputReadRefusedFailsTheJob(t *testing.T) {
	t.Parallel()
	bucket := newScopedBucket(t)
	b := setup(t)
	b.store = store.ForTenant(bucket.root(t), job.DefaultTenant) // the submitter's
	j := b.newJob("p", "t")
	key := store.TenantPrefix(job.DefaultTenant) + store.InputKey(j.Inputs[0].SHA256)
	bucket.srv.Deny(t, bucket.name, "worker", "s3:GetObject", key)
	b.shared = bucket.worker(t)
	var runs atomic.Int64
	var logs harness.LogBuffer
	b.worker(agentFunc(func(ctx context.Context, req agent.Request) (agent.Result, error) {
		runs.Add(1)
		return writeReport(ctx, req)
	}), func(c *runner.Config) { c.Logger = slog.New(slog.NewJSONHandler(&logs, nil)) })
	b.publish(j)
	st := b.waitFinal(j.ID, 2*time.Minute)
	letters := b.settledLetters()
	t.Logf("final status: state %s attempt %d error %q; the agent ran %d times", st.State, st.Attempt, st.Error, runs.Load())
	if st.State != job.StateFailed || st.Attempt != 1 || runs.Load() != 0 {
		t.Fatalf("job ended %s at attempt %d after %d runs of the agent, want failed at the first, never run", st.State, st.Attempt, runs.Load())
	}
	if len(letters) != 1 || letters[0].Reason != "input_refused" || letters[0].Attempt != 1 {
		t.Errorf("dead letters %+v, want one, input_refused, at attempt 1", letters)
	}
	if !strings.Contains(st.Error, "the store refuses the worker reading an input of the job") {
		t.Errorf("status error %q does not say the store refused reading an input", st.Error)
	}
	if remedy := "s3:GetObject on arn:aws:s3:::" + bucket.name + "/" + key; !strings.Contains(logs.String(), remedy) {
		t.Errorf("the worker's log does not say %q:\n%s", remedy, logs.String())
	}
	if strings.Contains(logs.String(), "waiting for the store") {
		t.Errorf("the worker waited for a store that refused the read:\n%s", logs.String())
	}
}

// TestInputNameRefusedForEveryTenantWaits: a bucket policy refusing the worker's reads of
// every tenant's inputs (tenants/*/inputs/*) is the worker's refusal, not the job's: the job
// waits for the store at its delivery, as for an outage, and runs once the policy is lifted.
// Before, it read as a policy on that one input (the store's own object reads) and failed the
// job input_refused, as it would every tenant's.
func TestInputNameRefusedForEveryTenantWaits(t *testing.T) {
	t.Parallel()
	bucket := newScopedBucket(t)
	b := setup(t)
	b.store = store.ForTenant(bucket.root(t), job.DefaultTenant) // the submitter's
	j := b.newJob("p", "t")
	bucket.srv.Deny(t, bucket.name, "worker", "s3:GetObject", "tenants/*/inputs/*")
	b.shared = bucket.worker(t)
	b.worker(agentFunc(writeReport))
	b.publish(j)
	var st job.Status
	waitFor(t, time.Minute, "the status to say the attempt waits for the store", func() bool {
		var err error
		st, err = b.q.Status(context.Background(), j.ID)
		return err == nil && strings.HasPrefix(st.Error, "waiting for the store") || st.State.Terminal()
	})
	if st.State.Terminal() {
		t.Fatalf("job ended %s (%q) while a policy refused every tenant's inputs; want it waiting", st.State, st.Error)
	}
	bucket.srv.Deny(t, bucket.name, "worker", "s3:GetObject", "no-key-is-named-so") // lifted
	if st = b.waitFinal(j.ID, 2*time.Minute); st.State != job.StateSucceeded || st.Attempt != 1 {
		t.Errorf("job ended %s at attempt %d (%q), want succeeded at the first once the policy is lifted", st.State, st.Attempt, st.Error)
	}
}
