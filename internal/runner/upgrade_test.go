package runner_test

import (
	"bytes"
	"context"
	"errors"
	"io"
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

// TestBareJobWithInputAtTheRootRuns: a job an older `submit` (before tenants) queued on the
// bare subject boxcar.jobs, with an input it uploaded where that submit put inputs (the store's
// root, inputs/sha256/<hex>), is moved by today's first start to tenant default's subject and
// runs as it would have: the worker moves the root's inputs into tenant default's folder before
// it fetches a job, and takes the input's URI at the root as that input. Before, the job ended
// failed (input_outside_tenant) at its first attempt.
func TestBareJobWithInputAtTheRootRuns(t *testing.T) {
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

// TestRootInputIsReadFromTheTenantsFolder: a job of tenant default may name its input at the
// shared store's root, where `submit` before tenants uploaded it, but the worker reads it only
// from the tenant's folder, where it moved the root's inputs at its start: an object put at the
// root since (no submit of this version puts one there) is not read, and the job fails
// input_missing, not with the root's bytes.
func TestRootInputIsReadFromTheTenantsFolder(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.worker(agentFunc(writeReport))
	// A first job ends once the worker fetches, so its move of the root is done by then.
	if first := b.submit("p"); b.waitFinal(first.ID, 30*time.Second).State != job.StateSucceeded {
		t.Fatal("the worker's first job did not succeed")
	}
	data := "put at the root after the worker started\n"
	sum, size, err := provenance.Digest(strings.NewReader(data))
	if err != nil {
		t.Fatal(err)
	}
	if err := b.shared.Put(context.Background(), store.InputKey(sum), strings.NewReader(data), size); err != nil {
		t.Fatal(err)
	}
	j := job.Job{Version: job.Version, ID: job.NewID(), Profile: "p", Task: "t", SubmittedAt: time.Now().UTC(),
		Inputs: []job.Input{{Name: "in.csv", URI: b.shared.URL(store.InputKey(sum)), SHA256: sum, Size: size}}}
	b.publish(j)
	st := b.waitFinal(j.ID, 30*time.Second)
	if st.State != job.StateFailed || !strings.Contains(st.Error, "is not in the store") {
		t.Fatalf("status %s, error %q; want failed, its input not in the tenant's folder", st.State, st.Error)
	}
	waitFor(t, 10*time.Second, "the dead letter", func() bool { return len(b.deadLetters()) > 0 })
	if dls := b.deadLetters(); len(dls) != 1 || dls[0].Reason != "input_missing" {
		t.Errorf("dead letters %+v, want one input_missing", dls)
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

// TestRunCommittedBeforeTenantsIsNotRunAgain: at the upgrade to tenants, a job an older worker
// already committed (its manifest at runs/ID/ in the store's root, where that worker wrote
// runs) but had not yet acknowledged is delivered again by tenant default's consumer. Today's
// worker moves the root's runs into tenant default's folder before it fetches a job, finds the
// run committed there and ends the job as its manifest says, without running it. Before, it
// looked under tenants/default/ only, ran the job again and committed a second run there,
// which the create-only manifest did not keep out: the two runs had different keys.
func TestRunCommittedBeforeTenantsIsNotRunAgain(t *testing.T) {
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
	got := b.waitFinal(j.ID, 30*time.Second)
	waitFor(t, 30*time.Second, "the job to be consumed", b.consumed)
	if n := runs.Load(); n != 0 {
		t.Errorf("the agent ran the job %d time(s), though an older worker had committed its run", n)
	}
	if got.State != job.StateSucceeded {
		t.Errorf("the job ended %s (%s), want succeeded as the older worker's manifest says", got.State, got.Error)
	}
	if stored := readAll(t, b.store, store.ManifestKey(j.ID)); !bytes.Equal(stored, manifest) {
		t.Errorf("tenant default's manifest of job %s is not the older worker's: a second run was committed\n%s", j.ID, stored)
	}
	if _, err := b.shared.Stat(ctx, store.ManifestKey(j.ID)); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("the older worker's run is still at the store's root (%v): two places to look for it", err)
	}
}

func readAll(t *testing.T, st store.Store, key string) []byte {
	t.Helper()
	rc, err := st.Get(context.Background(), key)
	if err != nil {
		t.Fatalf("%s: %v", st.URL(key), err)
	}
	defer rc.Close()
	data, err := io.ReadAll(rc)
	if err != nil {
		t.Fatal(err)
	}
	return data
}
