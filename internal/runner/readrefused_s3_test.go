//go:build integration

package runner_test

import (
	"strings"
	"testing"

	"github.com/boxcar-run/boxcar/internal/job"
	"github.com/boxcar-run/boxcar/internal/store"
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
	c := b.runCounted(j)
	if c.st.State != job.StateFailed || c.st.Attempt != 1 || c.runs != 0 {
		t.Fatalf("job ended %s at attempt %d after %d runs of the agent, want failed at the first, never run", c.st.State, c.st.Attempt, c.runs)
	}
	if len(c.letters) != 1 || c.letters[0].Reason != "input_refused" || c.letters[0].Attempt != 1 {
		t.Errorf("dead letters %+v, want one, input_refused, at attempt 1", c.letters)
	}
	if !strings.Contains(c.st.Error, "the store refuses the worker reading an input of the job") {
		t.Errorf("status error %q does not say the store refused reading an input", c.st.Error)
	}
	if remedy := "s3:GetObject on arn:aws:s3:::" + bucket.name + "/" + key; !strings.Contains(c.logs.String(), remedy) {
		t.Errorf("the worker's log does not say %q:\n%s", remedy, c.logs.String())
	}
	if strings.Contains(c.logs.String(), "waiting for the store") {
		t.Errorf("the worker waited for a store that refused the read:\n%s", c.logs.String())
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
	b.waitsForTheStore(j, "a policy refused every tenant's inputs", func() {
		bucket.srv.Deny(t, bucket.name, "worker", "s3:GetObject", "no-key-is-named-so")
	})
}
