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

// TestDeadLetterWaitsForASharedStreamThatAnswersNobody: an older worker of an upgrade wrote a
// job's dead letter in the shared stream and stopped before its term; the job comes to a worker
// of this version while the shared stream is there and answers nobody (its leader being
// elected, its server restarting). Its Term took that as no letter there and wrote a second
// one, into the tenant's stream: the job had two letters, and boxcar_dead_letters_total
// counted it twice. The Term now fails, writing nothing, and once the stream answers it finds
// the older worker's letter.
func TestDeadLetterWaitsForASharedStreamThatAnswersNobody(t *testing.T) {
	t.Parallel()
	u := newUpgrade(t, true)
	b := start(t, u.nc, u.cfg)
	j := b.submit(t)
	data, _ := json.Marshal(queue.DeadLetter{Tenant: tenant, JobID: j.ID, Reason: "max_deliveries"})
	if _, err := u.js.Publish(u.ctx, u.cfg.DeadLetterStream+"."+tenant+"."+j.ID, data, jetstream.WithExpectLastSequencePerSubject(0)); err != nil {
		t.Fatalf("an older worker dead-letters %s: %v", j.ID, err)
	}
	d := fetch(t, b.w, 10*time.Second)

	answer := u.silence(t, u.cfg.DeadLetterStream)
	lettered, err := d.Term(u.ctx, "invalid_message", errors.New("not a job"))
	answer()
	if lettered || err == nil {
		t.Errorf("Term while the shared stream answers nobody: lettered %v, %v; want nothing written, an error", lettered, err)
	}
	if lettered, err := d.Term(u.ctx, "invalid_message", errors.New("not a job")); lettered || err != nil {
		t.Errorf("Term once it answers: lettered %v, %v; want the older worker's letter found, none written", lettered, err)
	}
	if got := b.deadLetters(t); len(got) != 1 || got[u.cfg.DeadLetterStream+"."+tenant+"."+j.ID] != 1 {
		t.Errorf("dead letters %v; want the older worker's one alone", got)
	}
}
