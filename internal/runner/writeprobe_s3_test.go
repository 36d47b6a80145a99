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
	"github.com/boxcar-run/boxcar/internal/store/s3test"
	"github.com/boxcar-run/boxcar/test/harness"
)

// TestTenantFolderRefusingWritesFailsBeforeTheRun: on a real S3 server whose bucket policy
// refuses the worker's account every write under the tenant's folder (an operator scoping IAM
// by prefix, and leaving one tenant out), while the store's own probe object outside it is
// writable, the job fails at its first delivery without running the agent, and says which
// folder refused and what to change. Before, the refusal was found at the commit, after the
// run: the job ran again, model tokens and all, at each of its deliveries.
func TestTenantFolderRefusingWritesFailsBeforeTheRun(t *testing.T) {
	t.Parallel()
	srv := s3test.StartIAM(t)
	secret := srv.CreateUser(t, "worker")
	bucket := "boxcar-scoped"
	srv.CreateOwnedBucket(t, "worker", bucket)
	srv.DenyWritesUnder(t, bucket, "worker", store.TenantPrefix(job.DefaultTenant))
	b := setup(t)
	b.store = store.ForTenant(newS3Store(t, srv, bucket, srv.Endpoint), job.DefaultTenant) // the submitter's, as root
	vars := srv.UserVars("worker", secret)
	worker, err := store.NewS3(context.Background(), bucket, "", store.Options{Endpoint: srv.Endpoint, PathStyle: true,
		Getenv: func(k string) string { return vars[k] }})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { worker.Close() })
	b.shared = worker
	var runs atomic.Int64
	var logs harness.LogBuffer
	b.worker(agentFunc(func(ctx context.Context, req agent.Request) (agent.Result, error) {
		runs.Add(1)
		return writeReport(ctx, req)
	}), func(c *runner.Config) { c.Logger = slog.New(slog.NewJSONHandler(&logs, nil)) })
	j := b.submit("p")
	st := b.waitFinal(j.ID, 2*time.Minute)
	letters := b.settledLetters()
	t.Logf("final status: state %s error %q; the agent ran %d times", st.State, st.Error, runs.Load())
	if st.State != job.StateFailed || runs.Load() != 0 {
		t.Fatalf("job ended %s after %d runs of the agent, want failed before any run", st.State, runs.Load())
	}
	// The tenant is told what refused, in fixed words (the bucket is the operator's); the
	// worker's log names the folder and the permission to grant on it.
	if !strings.Contains(st.Error, "the store refuses the worker's writes under the tenant's folder") {
		t.Errorf("status error %q does not say the store refused the tenant's folder", st.Error)
	}
	if len(letters) != 1 || letters[0].Reason != "store_write_refused" || letters[0].Attempt != 1 || letters[0].Error != st.Error {
		t.Errorf("dead letters %+v, want one, store_write_refused, at attempt 1, saying %q", letters, st.Error)
	}
	remedy := "s3:PutObject on arn:aws:s3:::" + bucket + "/" + store.TenantPrefix(job.DefaultTenant) + "*"
	if !strings.Contains(logs.String(), remedy) {
		t.Errorf("the worker's log does not say %q:\n%s", remedy, logs.String())
	}
}
