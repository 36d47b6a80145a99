package runner_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

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

	// The job stream as a worker before tenants made it, and a job its submit published there.
	old, err := nats.Connect(b.url)
	if err != nil {
		t.Fatal(err)
	}
	defer old.Close()
	js, err := jetstream.New(old)
	if err != nil {
		t.Fatal(err)
	}
	n := cfg.NATS
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: n.Stream, Description: "Boxcar jobs", Subjects: []string{n.Subject},
		Retention: jetstream.WorkQueuePolicy, Storage: jetstream.FileStorage, Duplicates: time.Duration(n.DuplicateWindow),
		MaxMsgSize: job.MaxMessageBytes + 4096}); err != nil {
		t.Fatal(err)
	}
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
