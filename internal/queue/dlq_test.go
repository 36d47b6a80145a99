package queue_test

import (
	"context"
	"errors"
	"testing"
	"time"

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
