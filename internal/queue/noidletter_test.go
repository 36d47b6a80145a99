package queue_test

import (
	"encoding/json"
	"log/slog"
	"strings"
	"testing"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/boxcar-run/boxcar/internal/config"
	"github.com/boxcar-run/boxcar/internal/job"
	"github.com/boxcar-run/boxcar/internal/queue"
)

// TestSetupLettersAMessageWithoutAJobIDUnderItsTenant: an older Boxcar's shared stream took
// boxcar.jobs.>, and holds messages of team-a (served) and team-b (retired) on subjects that
// name no job (boxcar.jobs.T, boxcar.jobs.T.a.b). Setup dead-lettered each under tenant "",
// BOXCAR_DLQ.~unknown.stream-seq-N, which no tenant's submitter may read: the subject tells the
// tenant, and the letter is now that tenant's, read as its other letters are, invalid_job: no
// consumer delivers such a message, its tenant served or not.
func TestSetupLettersAMessageWithoutAJobIDUnderItsTenant(t *testing.T) {
	t.Parallel()
	cfg := drainConfig()
	b, _ := olderSetup(t, cfg, func(c *jetstream.StreamConfig) { c.Subjects = []string{cfg.Subject + ".>"} })
	ctx := t.Context()
	seqs := map[string]string{}
	for _, subject := range []string{"team-a.a.b", "team-b.a.b", "team-b"} {
		ack, err := b.js.Publish(ctx, cfg.Subject+"."+subject, []byte(`{"task":"t"}`), jetstream.WithExpectStream(cfg.Stream))
		if err != nil {
			t.Fatal(err)
		}
		seqs[subject] = job.SeqID(ack.Sequence)
	}
	admin, err := queue.NewAdmin(b.nc, cfg, map[string]config.Tenant{"team-a": {}}, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	if err := admin.Declare(ctx); err != nil {
		t.Fatal(err)
	}
	for subject, id := range seqs {
		tenant, _, _ := strings.Cut(subject, ".")
		r := queue.Ref{Tenant: tenant, ID: id}
		data, err := queue.DeadLetterOf(ctx, b.nc, cfg, r)
		if err != nil {
			t.Errorf("the letter of the message on %s.%s, under %s: %v; want it there", cfg.Subject, subject, r, err)
			continue
		}
		var dl queue.DeadLetter
		if err := json.Unmarshal(data, &dl); err != nil || dl.Tenant != tenant || dl.Reason != "invalid_job" || !strings.Contains(dl.Error, "names no job id") {
			t.Errorf("the letter of the message on %s.%s: %+v (%v); want %s's, invalid_job, saying its subject names no job id", cfg.Subject, subject, dl, err, tenant)
		}
	}
}
