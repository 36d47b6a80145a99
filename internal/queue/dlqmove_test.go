package queue_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/boxcar-run/boxcar/internal/config"
	"github.com/boxcar-run/boxcar/internal/queue"
)

// TestDeadLettersOfAnUpgradeAreKeptAndFound is an upgrade from one dead-letter stream for every
// tenant: the letters an older Boxcar wrote stay in the shared stream, and an older worker's
// letter published during the upgrade still lands there, on the subject it always had; a
// worker of this version writes a job's letter into its tenant's stream, but none for a job
// whose letter an older worker wrote already (it died before the term), and one its tenant's
// stream cannot take goes to the shared stream. Each is found by its job (queue.DeadLetterOf).
func TestDeadLettersOfAnUpgradeAreKeptAndFound(t *testing.T) {
	t.Parallel()
	u := newUpgrade(t, true)
	nc, js, ctx, cfg := u.nc, u.js, u.ctx, u.cfg
	cfg.AckWait, cfg.MaxDeliver = config.Duration(time.Second), 3
	// An older Boxcar's: no direct gets, and every tenant's letters.
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: cfg.DeadLetterStream, Subjects: []string{cfg.DeadLetterStream + ".>"}}); err != nil {
		t.Fatal(err)
	}
	older := func(id string) { // an older worker's letter of the tests' tenant's job
		t.Helper()
		data, _ := json.Marshal(queue.DeadLetter{Tenant: tenant, JobID: id, Reason: "max_deliveries"})
		if _, err := js.Publish(ctx, cfg.DeadLetterStream+"."+tenant+"."+id, data, jetstream.WithExpectLastSequencePerSubject(0)); err != nil {
			t.Fatalf("an older worker dead-letters %s: %v", id, err)
		}
	}
	before := newJob(t).ID
	older(before)

	var log bytes.Buffer
	w, err := queue.Open(ctx, nc, cfg, nil, slog.New(slog.NewTextHandler(&log, nil))) // declares, as `worker setup`
	if err != nil {
		t.Fatal(err)
	}
	b := bundle{nc: nc, js: js, w: w, cfg: cfg}
	b.c = b.client(t, tenant)
	during := newJob(t).ID
	older(during)
	// An older worker dead-lettered this job and stopped before its term: it comes again.
	again := b.submit(t)
	older(again.ID)
	fresh := b.submit(t)
	for range 2 {
		d := fetch(t, w, 10*time.Second)
		lettered, err := d.Term(ctx, "invalid_message", errors.New("not a job"))
		if want := d.JobID == fresh.ID; err != nil || lettered != want {
			t.Errorf("Term of %s: lettered %v, %v; want %v", d.JobID, lettered, err, want)
		}
	}
	own := queue.DeadLetterStream(cfg, tenant)
	if got := b.deadLetters(t); len(got) != 4 || got[own+"."+fresh.ID] != 1 || got[cfg.DeadLetterStream+"."+tenant+"."+again.ID] != 1 {
		t.Errorf("dead letters %v; want the older workers' three in %s and %s in %s, one a job", got, cfg.DeadLetterStream, fresh.ID, own)
	}
	for _, id := range []string{before, during, again.ID, fresh.ID} {
		if dl := b.deadLetter(t, ref(id)); dl.JobID != id {
			t.Errorf("dead letter of %s: %+v", id, dl)
		}
	}

	// A tenant's stream that is not there (no `worker setup` of this version ran).
	if err := js.DeleteStream(ctx, own); err != nil {
		t.Fatal(err)
	}
	homeless := b.submit(t)
	if lettered, err := fetch(t, w, 10*time.Second).Term(ctx, "invalid_message", errors.New("not a job")); err != nil || !lettered {
		t.Errorf("Term with no stream of the tenant's: lettered %v, %v; want the letter written", lettered, err)
	}
	if !strings.Contains(log.String(), "it goes to the shared dead-letter stream") {
		t.Errorf("the worker does not say where the letter went:\n%s", log.String())
	}
	if dl := b.deadLetter(t, ref(homeless.ID)); dl.JobID != homeless.ID {
		t.Errorf("dead letter of %s: %+v", homeless.ID, dl)
	}
}
