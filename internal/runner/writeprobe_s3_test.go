//go:build integration

package runner_test

import (
	"context"
	"errors"
	"log/slog"
	"path"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/boxcar-run/boxcar/internal/agent"
	"github.com/boxcar-run/boxcar/internal/config"
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
	b.shared = userS3Store(t, srv, bucket, "worker", secret)
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

// TestRunWritesRefusedAtTheCommitFailTheJob: on a real S3 server whose bucket policy refuses
// the worker's account every write under the job's run folder, but not the tenant's probe
// object (a policy scoped tighter than runs/*, or one revoked while the job ran), the run's
// first upload is refused (AccessDenied) and the job fails at that delivery, having run once,
// as store_write_refused, without a manifest, which could not be written there. Before, the
// store's PutOnce took the refusal for a put that may have been stored, the commit put it again
// until the attempt's deadline, and the job ran again at each of its deliveries.
func TestRunWritesRefusedAtTheCommitFailTheJob(t *testing.T) {
	t.Parallel()
	srv := s3test.StartIAM(t)
	secret := srv.CreateUser(t, "worker")
	bucket := "boxcar-scoped"
	srv.CreateOwnedBucket(t, "worker", bucket)
	b := setup(t)
	p := b.cfg.Profiles["p"]
	p.Limits.JobTimeout = config.Duration(10 * time.Second) // a commit that waits gives up after 20 s
	b.cfg.Profiles = map[string]config.Profile{"p": p}
	b.store = store.ForTenant(newS3Store(t, srv, bucket, srv.Endpoint), job.DefaultTenant) // the submitter's, as root
	j := b.newJob("p", "t")
	srv.DenyWritesUnder(t, bucket, "worker", store.TenantPrefix(job.DefaultTenant)+store.RunPrefix(j.ID))
	b.shared = userS3Store(t, srv, bucket, "worker", secret)
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
	if st.State != job.StateFailed || st.Attempt != 1 || runs.Load() != 1 {
		t.Fatalf("job ended %s at attempt %d after %d runs of the agent, want failed at the first, run once", st.State, st.Attempt, runs.Load())
	}
	if !strings.Contains(st.Error, "the store refused the worker's writes of the run under the tenant's folder") {
		t.Errorf("status error %q does not say the store refused the run's writes", st.Error)
	}
	if len(letters) != 1 || letters[0].Reason != "store_write_refused" || letters[0].Attempt != 1 || letters[0].Error != st.Error {
		t.Errorf("dead letters %+v, want one, store_write_refused, at attempt 1, saying %q", letters, st.Error)
	}
	if _, err := b.store.Stat(context.Background(), store.ManifestKey(j.ID)); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("manifest: %v, want none", err)
	}
	if strings.Contains(logs.String(), "waiting for the store") {
		t.Errorf("the worker waited for a store that refused the write:\n%s", logs.String())
	}
	if !strings.Contains(logs.String(), "AccessDenied") {
		t.Errorf("the worker's log does not say what the store answered:\n%s", logs.String())
	}
}

// TestCommittedRunIsAdoptedWhereWritesAreRefused: a worker commits the run and dies before
// its ack; the next delivery goes to a worker whose credentials the store refuses writes
// under the tenant's folder. The run is committed, so that delivery adopts it: the job
// succeeded, with no dead letter. A claim that proved the writes before it looked for the
// committed run failed the job store_write_refused beside its succeeded manifest.
func TestCommittedRunIsAdoptedWhereWritesAreRefused(t *testing.T) {
	t.Parallel()
	srv := s3test.StartIAM(t)
	secret := srv.CreateUser(t, "worker")
	bucket := "boxcar-scoped"
	srv.CreateOwnedBucket(t, "worker", bucket)
	srv.DenyWritesUnder(t, bucket, "worker", store.TenantPrefix(job.DefaultTenant))
	b := setup(t)
	root := newS3Store(t, srv, bucket, srv.Endpoint)
	b.store, b.shared = store.ForTenant(root, job.DefaultTenant), root
	var first atomic.Pointer[worker] // set before the job is published, read by the worker's hook
	committed := make(chan struct{})
	dies := &hookStore{Store: root, afterCreate: func(key string) {
		if path.Base(key) == "manifest.json" {
			first.Load().nc.Close() // killed between the commit and the ack
			close(committed)
		}
	}}
	first.Store(b.worker(agentFunc(writeReport), func(c *runner.Config) { c.Store = dies }))
	j := b.submit("p")
	<-committed

	refused := userS3Store(t, srv, bucket, "worker", secret)
	b.worker(agentFunc(func(ctx context.Context, req agent.Request) (agent.Result, error) {
		t.Errorf("the committed job ran again")
		return writeReport(ctx, req)
	}), func(c *runner.Config) { c.Store = refused })
	st := b.waitFinal(j.ID, 2*time.Minute)
	if letters := b.settledLetters(); st.State != job.StateSucceeded || len(letters) != 0 {
		t.Errorf("job ended %s (%q) with %d dead letters; want its committed run's end, succeeded, and none", st.State, st.Error, len(letters))
	}
}

// userS3Store is the store of bucket on srv as the account access, whose secret CreateUser
// returned.
func userS3Store(t *testing.T, srv *s3test.Server, bucket, access, secret string) store.Store {
	t.Helper()
	vars := srv.UserVars(access, secret)
	st, err := store.NewS3(context.Background(), bucket, "", store.Options{Endpoint: srv.Endpoint, PathStyle: true,
		Getenv: func(k string) string { return vars[k] }})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	return st
}
