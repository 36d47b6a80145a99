package runner_test

import (
	"bytes"
	"context"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/boxcar-run/boxcar/internal/agent"
	"github.com/boxcar-run/boxcar/internal/config"
	"github.com/boxcar-run/boxcar/internal/job"
	"github.com/boxcar-run/boxcar/internal/provenance"
	"github.com/boxcar-run/boxcar/internal/store"
)

// TestAuditUpgradeBareJobWithInputRuns: a job an older `submit` (before tenants) queued on the
// bare subject boxcar.jobs, with an input it uploaded where that submit put inputs (the store's
// root, inputs/sha256/<hex>), is moved by today's first start to tenant default's subject and
// promised to "run as it would have" (queue/bare.go, docs/operations.md). It ends failed
// (input_outside_tenant) at its first attempt instead: the worker reads inputs only under
// tenants/default/, and neither the move nor the worker brings the input along.
func TestAuditUpgradeBareJobWithInputRuns(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b, js := olderBundle(t)
	st, n := b.shared, b.cfg.NATS
	data := "a,b\n1,2\n"
	sum, size, err := provenance.Digest(strings.NewReader(data))
	if err != nil {
		t.Fatal(err)
	}
	key := store.InputKey(sum) // the older submit's key: the store's root
	if err := st.PutIfAbsent(ctx, key, strings.NewReader(data), size); err != nil {
		t.Fatal(err)
	}
	j := job.Job{Version: job.Version, ID: job.NewID(), Profile: "p", Task: "t", SubmittedAt: time.Now().UTC(),
		Inputs: []job.Input{{Name: "in.csv", URI: st.URL(key), SHA256: sum, Size: size}}}
	msg, err := j.Encode()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := js.Publish(ctx, n.Subject, msg, jetstream.WithMsgID(j.ID)); err != nil {
		t.Fatal(err)
	}

	// Today's worker starts: it declares (moving the job) and runs it.
	b.nc, b.q = b.client()
	b.worker(agentFunc(writeReport))
	got := b.waitFinal(j.ID, 30*time.Second)
	if got.State != job.StateSucceeded {
		t.Errorf("the older submit's job moved off the bare subject ended %s (%s), want succeeded: it ran as it would have before the upgrade",
			got.State, got.Error)
	}
}

// olderJobStream makes the job stream as a worker before tenants made it (one subject, the bare
// boxcar.jobs; see the queue package's olderSetup) on b's server, before any of today's
// workers or clients declared anything, and returns a JetStream handle an older submit uses.
func olderJobStream(t *testing.T, b *bundle) jetstream.JetStream {
	t.Helper()
	ctx := context.Background()
	old, err := nats.Connect(b.url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(old.Close)
	js, err := jetstream.New(old)
	if err != nil {
		t.Fatal(err)
	}
	n := b.cfg.NATS
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: n.Stream, Description: "Boxcar jobs", Subjects: []string{n.Subject},
		Retention: jetstream.WorkQueuePolicy, Storage: jetstream.FileStorage, Duplicates: time.Duration(n.DuplicateWindow),
		MaxMsgSize: job.MaxMessageBytes + 4096}); err != nil {
		t.Fatal(err)
	}
	return js
}

// olderBundle is setup's bundle with the job stream an older Boxcar made, and no client yet.
func olderBundle(t *testing.T) (*bundle, jetstream.JetStream) {
	t.Helper()
	b := &bundle{t: t, storeDir: t.TempDir()}
	b.start(-1)
	cfg, err := config.Parse([]byte(profiles))
	if err != nil {
		t.Fatal(err)
	}
	b.cfg = cfg
	st, err := store.NewFile(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	b.shared = st
	b.store = store.ForTenant(st, job.DefaultTenant)
	return b, olderJobStream(t, b)
}

// TestAuditUpgradeRunCommittedBeforeTenantsIsNotRunAgain: at the upgrade to tenants, a job an
// older worker already committed (its manifest at runs/ID/ in the store's root, where that
// worker wrote runs) but had not yet acknowledged is delivered again by tenant default's
// consumer (docs/operations.md: "a job in flight on a worker of the old version may then run
// twice; the create-only manifest lets one commit"). Today's worker looks for a committed run
// only under tenants/default/, finds none, runs the job again and commits a second run: the
// create-only manifest does not keep it, since the two runs have different keys.
func TestAuditUpgradeRunCommittedBeforeTenantsIsNotRunAgain(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	b, js := olderBundle(t)
	n := b.cfg.NATS
	j := job.Job{Version: job.Version, ID: job.NewID(), Profile: "p", Task: "t", SubmittedAt: time.Now().UTC()}
	// The older worker's committed run: a manifest naming no tenant, at the root's runs/ID/.
	report := []byte("# the older worker's report\n")
	sum, size, err := provenance.Digest(bytes.NewReader(report))
	if err != nil {
		t.Fatal(err)
	}
	manifest, err := provenance.Build(provenance.Manifest{
		Job:     provenance.Job{ID: j.ID, Profile: "p", Task: "t", SubmittedAt: j.SubmittedAt},
		Outcome: provenance.Outcome{State: job.StateSucceeded},
	}, []provenance.Subject{{Name: "report.md", SHA256: sum, Size: size}})
	if err != nil {
		t.Fatal(err)
	}
	for key, data := range map[string][]byte{store.RunPrefix(j.ID) + "report.md": report, store.ManifestKey(j.ID): manifest} {
		if err := b.shared.PutIfAbsent(ctx, key, bytes.NewReader(data), int64(len(data))); err != nil {
			t.Fatal(err)
		}
	}
	msg, err := j.Encode()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := js.Publish(ctx, n.Subject, msg, jetstream.WithMsgID(j.ID)); err != nil {
		t.Fatal(err)
	}

	var runs atomic.Int64
	b.nc, b.q = b.client()
	b.worker(agentFunc(func(ctx context.Context, req agent.Request) (agent.Result, error) {
		runs.Add(1)
		return writeReport(ctx, req)
	}))
	waitFor(t, 30*time.Second, "the job to be consumed", b.consumed)
	if got := runs.Load(); got != 0 {
		t.Errorf("the agent ran the job %d time(s), though an older worker had committed its run", got)
	}
	if _, err := b.store.Stat(ctx, store.ManifestKey(j.ID)); err == nil {
		t.Errorf("a second run of job %s was committed (tenants/default/%s) beside the older worker's (%s)", j.ID, store.ManifestKey(j.ID), store.ManifestKey(j.ID))
	}
}
