package queue_test

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	"github.com/boxcar-run/boxcar/internal/config"
	"github.com/boxcar-run/boxcar/internal/job"
	"github.com/boxcar-run/boxcar/internal/queue"
	"github.com/boxcar-run/boxcar/test/harness"
)

// TestSetupLettersASweptJobTenantRetired: the sweep of a worker of the new config ended a
// retired team-b's job dead, its status written, and could not write its letter (here its login
// may not publish team-b's letters; a worker that stopped there leaves the same). The next
// `worker setup` found the job ended dead and wrote the letter of a dead end it did not know,
// max_deliveries, where the job ended tenant_retired, as the sweep's own next try writes it.
// And the sweep said the server refused it the tenant's consumer, where it refused the letter.
func TestSetupLettersASweptJobTenantRetired(t *testing.T) {
	t.Parallel()
	cfg := config.Config{}.WithDefaults().NATS
	cfg.AckWait = config.Duration(time.Second)
	conn := serverDenyingWorker(t, queue.DeadLetterStream(cfg, "team-b")+".>", cfg.DeadLetterStream+".team-b.>")
	b := start(t, conn("op"), cfg)
	ctx := t.Context()
	old, _, d := b.fetchedByOldWorker(t)
	if _, err := old.UpdateStatus(ctx, d.Ref(), func(s *job.Status) { s.State, s.Attempt = job.StateRunning, d.Attempt }, queue.ByAttempt(d.Attempt)); err != nil {
		t.Fatal(err)
	}
	b.declare(t, map[string]config.Tenant{"team-a": {}}) // team-b's running job is left to its run
	var log bytes.Buffer
	w := bundle{nc: conn("worker"), cfg: cfg}.open(t, cfg, map[string]config.Tenant{"team-a": {}}, &log)
	harness.Wait(t, "the sweep to end team-b's job dead", func() (bool, error) {
		w.SweepNow()
		wait, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
		defer cancel()
		_, _ = w.Fetch(wait)
		st, err := old.Status(ctx, d.Ref())
		return err == nil && st.State == job.StateDead, nil
	}, harness.Within(30*time.Second))
	if said := log.String(); strings.Contains(said, "refuses this worker the consumer") {
		t.Errorf("the sweep, refused the job's dead letter, says the server refused it the consumer:\n%s", said)
	}
	b.declare(t, map[string]config.Tenant{"team-a": {}})
	if dl := b.deadLetter(t, d.Ref()); dl.Reason != queue.ReasonTenantRetired {
		t.Errorf("setup's letter of the job the sweep ended: reason %s, error %q; want %s", dl.Reason, dl.Error, queue.ReasonTenantRetired)
	}
}
