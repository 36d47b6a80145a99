//go:build integration

package runner_test

import (
	"context"
	"errors"
	"path"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/boxcar-run/boxcar/internal/agent"
	"github.com/boxcar-run/boxcar/internal/config"
	"github.com/boxcar-run/boxcar/internal/job"
	"github.com/boxcar-run/boxcar/internal/runner"
	"github.com/boxcar-run/boxcar/internal/store"
	"github.com/boxcar-run/boxcar/internal/store/s3test"
)

// TestTenantFolderRefusingWritesFailsBeforeTheRun: on a real S3 server whose bucket policy
// refuses the worker's account every write under the tenant's folder (an operator scoping IAM
// by prefix, and leaving one tenant out), while the store's own probe object outside it is
// writable, the job fails at its first delivery without running the agent, and says which
// folder refused and what to change. Before, the refusal was found at the commit, after the
// run: the job ran again, model tokens and all, at each of its deliveries.
func TestTenantFolderRefusingWritesFailsBeforeTheRun(t *testing.T) {
	t.Parallel()
	bucket := newScopedBucket(t)
	bucket.refuse(t, store.TenantPrefix(job.DefaultTenant))
	b := setup(t)
	b.store = store.ForTenant(bucket.root(t), job.DefaultTenant) // the submitter's
	b.shared = bucket.worker(t)
	c := b.runCounted(b.newJob("p", "t"))
	st, letters, logs := c.st, c.letters, c.logs
	if st.State != job.StateFailed || c.runs != 0 {
		t.Fatalf("job ended %s after %d runs of the agent, want failed before any run", st.State, c.runs)
	}
	// The tenant is told what refused, in fixed words (the bucket is the operator's); the
	// worker's log names the folder and the permission to grant on it.
	if !strings.Contains(st.Error, "the store refuses the worker's writes under the tenant's folder") {
		t.Errorf("status error %q does not say the store refused the tenant's folder", st.Error)
	}
	if len(letters) != 1 || letters[0].Reason != "store_write_refused" || letters[0].Attempt != 1 || letters[0].Error != st.Error {
		t.Errorf("dead letters %+v, want one, store_write_refused, at attempt 1, saying %q", letters, st.Error)
	}
	remedy := "s3:PutObject on arn:aws:s3:::" + bucket.name + "/" + store.TenantPrefix(job.DefaultTenant) + "*"
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
	bucket := newScopedBucket(t)
	b := setup(t)
	p := b.cfg.Profiles["p"]
	p.Limits.JobTimeout = config.Duration(10 * time.Second) // a commit that waits gives up after 20 s
	b.cfg.Profiles = map[string]config.Profile{"p": p}
	b.store = store.ForTenant(bucket.root(t), job.DefaultTenant) // the submitter's
	j := b.newJob("p", "t")
	bucket.refuse(t, store.TenantPrefix(job.DefaultTenant)+store.RunPrefix(j.ID))
	b.shared = bucket.worker(t)
	c := b.runCounted(j)
	st, letters, logs := c.st, c.letters, c.logs
	if st.State != job.StateFailed || st.Attempt != 1 || c.runs != 1 {
		t.Fatalf("job ended %s at attempt %d after %d runs of the agent, want failed at the first, run once", st.State, st.Attempt, c.runs)
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
	bucket := newScopedBucket(t)
	bucket.refuse(t, store.TenantPrefix(job.DefaultTenant))
	b := setup(t)
	root := bucket.root(t)
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

	refused := bucket.worker(t)
	b.worker(agentFunc(func(ctx context.Context, req agent.Request) (agent.Result, error) {
		t.Errorf("the committed job ran again")
		return writeReport(ctx, req)
	}), func(c *runner.Config) { c.Store = refused })
	st := b.waitFinal(j.ID, 2*time.Minute)
	if letters := b.settledLetters(); st.State != job.StateSucceeded || len(letters) != 0 {
		t.Errorf("job ended %s (%q) with %d dead letters; want its committed run's end, succeeded, and none", st.State, st.Error, len(letters))
	}
}

// scopedBucket is a bucket on a versitygw of its own, owned by the account "worker", as an
// operator scopes a worker's IAM user: its policy may refuse that account's writes by prefix.
type scopedBucket struct {
	srv          *s3test.Server
	name, secret string
}

func newScopedBucket(t *testing.T) *scopedBucket {
	t.Helper()
	b := &scopedBucket{srv: s3test.StartIAM(t), name: "boxcar-scoped"}
	b.secret = b.srv.CreateUser(t, "worker")
	b.srv.CreateOwnedBucket(t, "worker", b.name)
	return b
}

// refuse makes the bucket's policy refuse the worker's writes under prefix.
func (b *scopedBucket) refuse(t *testing.T, prefix string) {
	t.Helper()
	b.srv.DenyWritesUnder(t, b.name, "worker", prefix)
}

// root is the bucket's store as the server's root account, which no policy refuses.
func (b *scopedBucket) root(t *testing.T) store.Store {
	t.Helper()
	return newS3Store(t, b.srv, b.name, b.srv.Endpoint)
}

// worker is the bucket's store as the account "worker".
func (b *scopedBucket) worker(t *testing.T) store.Store {
	t.Helper()
	vars := b.srv.UserVars("worker", b.secret)
	st, err := store.NewS3(context.Background(), b.name, "", store.Options{Endpoint: b.srv.Endpoint, PathStyle: true,
		Getenv: func(k string) string { return vars[k] }})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	return st
}

// TestRefusedEndEndsTheJobOnce: a job that ends before its agent runs (a profile the worker
// does not define, an input gone from the store) in a tenant whose folder, or whose run's
// folder, the store refuses the worker's writes to, ends at that delivery as it was decided,
// with its one dead letter and no manifest, which could not be written. Before, the refused
// manifest left the end undecided: every delivery, the exhausted one too, tried it again, and
// the job never ended.
func TestRefusedEndEndsTheJobOnce(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name   string
		state  job.State
		reason string
		// job makes the job and returns the folder refused, under the tenant's.
		job func(b *bundle) (job.Job, string)
	}{
		{name: "unknown profile, the tenant's folder refused", state: job.StateRejected, reason: "unknown_profile", job: func(b *bundle) (job.Job, string) {
			return b.newJob("nope", "t"), ""
		}},
		{name: "input gone, the run's folder refused", state: job.StateFailed, reason: "input_missing", job: func(b *bundle) (job.Job, string) {
			j := b.newJob("p", "t")
			if err := b.store.Delete(context.Background(), store.InputKey(j.Inputs[0].SHA256)); err != nil {
				b.t.Fatal(err)
			}
			return j, store.RunPrefix(j.ID)
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			bucket := newScopedBucket(t)
			b := setup(t)
			b.store = store.ForTenant(bucket.root(t), job.DefaultTenant) // the submitter's, as root
			j, folder := tt.job(b)
			bucket.refuse(t, store.TenantPrefix(job.DefaultTenant)+folder)
			b.shared = bucket.worker(t)
			b.worker(agentFunc(func(ctx context.Context, req agent.Request) (agent.Result, error) {
				t.Errorf("the agent ran a job that ends before it")
				return writeReport(ctx, req)
			}))
			b.publish(j)
			st := b.waitFinal(j.ID, time.Minute)
			letters := b.settledLetters()
			t.Logf("final status: state %s attempt %d error %q", st.State, st.Attempt, st.Error)
			if st.State != tt.state || len(letters) != 1 || letters[0].Reason != tt.reason || letters[0].Attempt != 1 {
				t.Errorf("job ended %s with dead letters %+v; want %s and one letter, %s, at attempt 1", st.State, letters, tt.state, tt.reason)
			}
			if _, err := b.store.Stat(context.Background(), store.ManifestKey(j.ID)); !errors.Is(err, store.ErrNotFound) {
				t.Errorf("manifest: %v, want none", err)
			}
		})
	}
}

// TestOwnBucketGoneFailsTheTenantsJob: a tenant whose own bucket (tenants.T.bucket) does not
// exist (deleted, misnamed) has its job fail at its first delivery, store_write_refused, before
// its agent runs: no run of it can be kept, and the bucket serves no other tenant. Before, the
// claim waited for the bucket as for an outage until the run had to start, and the job was
// tried again at each delivery until it died.
func TestOwnBucketGoneFailsTheTenantsJob(t *testing.T) {
	t.Parallel()
	srv := s3test.Start(t)
	b := setup(t)
	p := b.cfg.Profiles["p"]
	p.Limits.JobTimeout = config.Duration(10 * time.Second) // a claim that waits gives up after 10 s
	b.cfg.Profiles = map[string]config.Profile{"p": p}
	gone := newS3Store(t, srv, "boxcar-no-such-bucket", srv.Endpoint)
	c := b.runCounted(b.newJob("p", "t"), func(c *runner.Config) { c.TenantStores = map[string]store.Store{job.DefaultTenant: gone} })
	if c.st.State != job.StateFailed || c.runs != 0 || len(c.letters) != 1 || c.letters[0].Reason != "store_write_refused" || c.letters[0].Attempt != 1 {
		t.Errorf("job ended %s after %d runs with dead letters %+v; want failed before any run, one letter, store_write_refused, at attempt 1", c.st.State, c.runs, c.letters)
	}
}

// TestStaleAttemptCannotCommitAfterARefusedEnd: attempt 1, on a worker the store takes, stalls
// past the ack wait mid-run; attempt 2 goes to a worker whose writes the store refuses under the
// tenant's folder and ends the job store_write_refused, with its dead letter. Attempt 1 then
// resumes and must not commit a run beside that end: the final status names attempt 2, and
// attempt 1's commit finds a later attempt and discards its result. Before, the status kept
// attempt 1, whose commit went through: a succeeded manifest beside a failed job's dead letter.
func TestStaleAttemptCannotCommitAfterARefusedEnd(t *testing.T) {
	t.Parallel()
	bucket := newScopedBucket(t)
	bucket.refuse(t, store.TenantPrefix(job.DefaultTenant))
	b := setup(t)
	root := bucket.root(t)
	b.store, b.shared = store.ForTenant(root, job.DefaultTenant), root
	j := b.newJob("p", "t")
	stale := b.worker(agentFunc(func(ctx context.Context, req agent.Request) (agent.Result, error) {
		waitFor(t, time.Minute, "the job to end at another delivery", func() bool {
			st, err := b.q.Status(context.Background(), j.ID)
			return err == nil && st.State.Terminal()
		})
		return writeReport(ctx, req)
	}), func(c *runner.Config) { c.HeartbeatInterval, c.Worker.Concurrency = time.Hour, 1 })
	b.publish(j)
	b.worker(agentFunc(writeReport), func(c *runner.Config) { c.Store = bucket.worker(t) })
	waitFor(t, time.Minute, "the stalled attempt to end", func() bool {
		return testutil.ToFloat64(stale.m.StaleAttempts) == 1 || testutil.ToFloat64(stale.m.Jobs.WithLabelValues("p", "succeeded")) == 1
	})
	st := b.waitFinal(j.ID, time.Minute)
	if _, err := b.store.Stat(context.Background(), store.ManifestKey(j.ID)); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("manifest: %v; want none beside the job's end, %s (%q) at attempt %d", err, st.State, st.Error, st.Attempt)
	}
	if letters := b.settledLetters(); st.State != job.StateFailed || st.Attempt != 2 || len(letters) != 1 || letters[0].Reason != "store_write_refused" {
		t.Errorf("job ended %s at attempt %d with dead letters %+v; want failed at attempt 2, one letter, store_write_refused", st.State, st.Attempt, letters)
	}
}

// TestUnsignedRunIsAdoptedWhereWritesAreRefused: a worker commits the run and dies before its
// signature is put in place, and before its ack; the next delivery goes to a worker whose
// writes the store refuses under the tenant's folder. That delivery cannot copy the envelope
// into place, and adopts the run all the same, unsigned, as a run whose attempt left no
// envelope is: the job succeeded, with no dead letter, its status marked unsigned (`submit
// status` says so). Before, the refused copy left the end undecided, and every delivery tried
// again, for ever; and then the status did not say the run was unsigned.
func TestUnsignedRunIsAdoptedWhereWritesAreRefused(t *testing.T) {
	t.Parallel()
	bucket := newScopedBucket(t)
	bucket.refuse(t, store.TenantPrefix(job.DefaultTenant))
	b := setup(t)
	root := bucket.root(t)
	b.store, b.shared = store.ForTenant(root, job.DefaultTenant), root
	priv, _ := signingKeys(t)
	var first atomic.Pointer[worker] // set before the job is published, read by the worker's hook
	committed := make(chan struct{})
	dies := &hookStore{Store: root, afterCreate: func(key string) {
		if path.Base(key) == "manifest.json" {
			first.Load().nc.Close() // killed between the commit and the ack
			close(committed)
		}
	}, put: func(key string) error {
		if path.Base(key) == "manifest.dsse.json" && !strings.Contains(key, "/attempts/") {
			return errors.New("killed before the signature was put in place")
		}
		return nil
	}}
	first.Store(b.worker(agentFunc(writeReport), func(c *runner.Config) { c.Store, c.SigningKey = dies, priv }))
	j := b.submit("p")
	<-committed

	refused := bucket.worker(t)
	b.worker(agentFunc(func(ctx context.Context, req agent.Request) (agent.Result, error) {
		t.Errorf("the committed job ran again")
		return writeReport(ctx, req)
	}), func(c *runner.Config) { c.Store, c.SigningKey = refused, priv })
	st := b.waitFinal(j.ID, time.Minute)
	if letters := b.settledLetters(); st.State != job.StateSucceeded || len(letters) != 0 {
		t.Errorf("job ended %s (%q) with %d dead letters; want its committed run's end, succeeded, and none", st.State, st.Error, len(letters))
	}
	if !st.Unsigned {
		t.Errorf("the status of the run adopted without its signature does not mark it unsigned: %+v", st)
	}
}
