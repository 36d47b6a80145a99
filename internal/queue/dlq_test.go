package queue_test

import (
	"context"
	"encoding/json"
	"errors"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/boxcar-run/boxcar/internal/config"
	"github.com/boxcar-run/boxcar/internal/job"
	"github.com/boxcar-run/boxcar/internal/queue"
)

// TestEveryJobIDHasADeadLetterOfItsOwn: a job's dead letter is published only while its
// subject holds none, so two ids that share a subject leave the second job without a trace.
// The subject's last token is made of the id without loss: ids that differ only where NATS
// allows no character ("job*0001" and "job_0001", an é and two underscores) each keep a
// letter, while a valid id's subject is its id in its tenant's stream: BOXCAR_DLQ_<tenant>.<id>.
func TestEveryJobIDHasADeadLetterOfItsOwn(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	valid := job.NewID()
	// Subject tokens after the tenant, each a job id.
	tokens := []string{valid, "job_0001", "job*0001", "job__0001", "job\u00e90001", "job~2A0001", "~"}
	for _, tok := range tokens {
		if _, err := b.js.Publish(ctx, b.cfg.Subject+"."+tenant+"."+tok, []byte(`{"not":"a job"}`)); err != nil {
			t.Fatalf("publish %q: %v", tok, err)
		}
	}
	for range tokens {
		d := fetch(t, b.w, 10*time.Second)
		lettered, err := d.Term(ctx, "invalid_message", errors.New("not a job"))
		if err != nil || !lettered {
			t.Errorf("Term of job %q: lettered %v, %v; want its own dead letter written", d.JobID, lettered, err)
		}
	}
	subjects := b.deadLetters(t)
	if len(subjects) != len(tokens) {
		t.Errorf("%d dead-letter subjects for %d jobs: %v", len(subjects), len(tokens), subjects)
	}
	at := queue.DeadLetterStream(b.cfg, tenant) + "." + valid
	if subjects[at] != 1 {
		t.Errorf("the valid id's dead letter is not at %s: %v", at, subjects)
	}
	if dl := b.deadLetter(t, ref(valid)); dl.JobID != valid {
		t.Errorf("dead letter of the valid id = %+v", dl)
	}
}

// TestDeadLetterWaitsOutItsStreamsElection: the tenant's dead-letter stream is there but
// answers no publish a while (its leader being elected; here its subjects taken away until the
// worker looks the stream up), and the job's letter goes into it once it answers, where its
// tenant's submitter lists it: not into the shared stream, which nobody answering meant only
// where there is no tenant's stream at all. Before, the letter went to BOXCAR_DLQ at once.
func TestDeadLetterWaitsOutItsStreamsElection(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	j := b.submit(t)
	d := fetch(t, b.w, 10*time.Second)
	name := queue.DeadLetterStream(b.cfg, tenant)
	cfg := streamConfig(t, b.js, name)
	away := cfg
	away.Subjects = []string{name + "-away.>"}
	if _, err := b.js.UpdateStream(ctx, away); err != nil {
		t.Fatal(err)
	}
	looks, err := b.nc.SubscribeSync("$JS.API.STREAM.INFO." + name)
	if err != nil {
		t.Fatal(err)
	}
	looking, stop := context.WithCancel(ctx)
	back := make(chan error, 1)
	go func() { // the stream answers again once the worker looked it up after a publish nobody answered
		_, err := looks.NextMsgWithContext(looking)
		if err == nil {
			_, err = b.js.UpdateStream(ctx, cfg)
		}
		back <- err
	}()
	lettered, err := d.Term(ctx, "exhausted", errors.New("no more attempts"))
	stop()
	if err := <-back; err != nil && !errors.Is(err, context.Canceled) {
		t.Fatal(err)
	}
	if err != nil || !lettered {
		t.Fatalf("Term: lettered %t, %v; want the letter written", lettered, err)
	}
	if subjects := b.deadLetters(t); subjects[name+"."+j.ID] != 1 {
		t.Errorf("the job's letter is not in its tenant's stream %s: %v", name, subjects)
	}
}

// TestDeadLetterNeverGoesAroundItsStreamsLetter: an earlier delivery of a job wrote its letter
// into the tenant's stream and its worker died before the term; the next delivery ends the job
// while that stream is there and answers nobody for longer than letterRounds. Its letter went
// to the shared stream, whose one-a-subject check cannot see the tenant's: the job had two
// letters. The Term now fails, writing nothing, and once the stream answers finds the letter.
func TestDeadLetterNeverGoesAroundItsStreamsLetter(t *testing.T) {
	t.Parallel()
	b := setup(t, func(c *config.NATS) { c.AckWait = config.Duration(time.Minute) })
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	j := b.submit(t)
	d := fetch(t, b.w, 10*time.Second)
	name := queue.DeadLetterStream(b.cfg, tenant)
	data, _ := json.Marshal(queue.DeadLetter{Tenant: tenant, JobID: j.ID, Reason: "exhausted", Attempt: d.Attempt - 1})
	if _, err := b.js.Publish(ctx, name+"."+j.ID, data, jetstream.WithExpectLastSequencePerSubject(0)); err != nil {
		t.Fatalf("the earlier delivery's letter: %v", err)
	}
	cfg := streamConfig(t, b.js, name)
	away := cfg
	away.Subjects = []string{name + "-away.>"}
	if _, err := b.js.UpdateStream(ctx, away); err != nil {
		t.Fatal(err)
	}
	lettered, err := d.Term(ctx, "exhausted", errors.New("no more attempts"))
	if lettered || err == nil {
		t.Errorf("Term while the tenant's stream answers nobody: lettered %t, %v; want nothing written, an error", lettered, err)
	}
	if _, err := b.js.UpdateStream(ctx, cfg); err != nil {
		t.Fatal(err)
	}
	if lettered, err := d.Term(ctx, "exhausted", errors.New("no more attempts")); lettered || err != nil {
		t.Errorf("Term once it answers: lettered %t, %v; want the earlier letter found, none written", lettered, err)
	}
	if got := b.deadLetters(t); len(got) != 1 || got[name+"."+j.ID] != 1 {
		t.Errorf("dead letters %v; want the earlier delivery's one alone, in %s", got, name)
	}
}

// TestTermReadsItsLetterBackOnceItsStreamAnswers: a Term's publish of the job's letter got no
// answer (here the stream acks nothing) and landed; the settle tries the Term again, the server
// refuses the second letter, and the Term reads the one there back to tell whether it is its
// own while the stream answers no read (its leader being elected). It took that as no letter of
// its: the job ended with its letter written and counted by no delivery, and nothing said so but
// one log line. The Term now fails, terminating nothing, and once the stream answers reads the
// letter back and says it wrote it.
func TestTermReadsItsLetterBackOnceItsStreamAnswers(t *testing.T) {
	t.Parallel()
	b := setup(t, func(c *config.NATS) { c.AckWait = config.Duration(time.Minute) })
	u := upgrade{ctx: t.Context(), nc: b.nc, js: b.js, cfg: b.cfg}
	j := b.submit(t)
	d := fetch(t, b.w, 10*time.Second)
	name := queue.DeadLetterStream(b.cfg, tenant)
	edit(t, b.js, name, func(c *jetstream.StreamConfig) { c.NoAck = true })
	quick, cancel := context.WithTimeout(t.Context(), 2*time.Second)
	lettered, err := d.Term(quick, "exhausted", errors.New("no more attempts"))
	cancel()
	if lettered || err == nil {
		t.Fatalf("Term whose publish got no answer: lettered %t, %v; want an error", lettered, err)
	}
	edit(t, b.js, name, func(c *jetstream.StreamConfig) { c.NoAck = false })

	answer := u.silence(t, name)
	lettered, err = d.Term(t.Context(), "exhausted", errors.New("no more attempts"))
	answer()
	if lettered || err == nil {
		t.Errorf("Term that cannot read its letter back: lettered %t, %v; want an error, the job not terminated", lettered, err)
	}
	if lettered, err := d.Term(t.Context(), "exhausted", errors.New("no more attempts")); !lettered || err != nil {
		t.Errorf("Term once the stream answers: lettered %t, %v; want its letter read back, and counted", lettered, err)
	}
	if got := b.deadLetters(t); len(got) != 1 || got[name+"."+j.ID] != 1 {
		t.Errorf("dead letters %v; want the one letter in %s", got, name)
	}
}
