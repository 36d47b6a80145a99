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
)

// TestSweepRefusedARetiredTenantSaysSoOnce: a worker of the new config, whose credentials were
// generated without the retired team-b, sweeps what team-b's consumer delivers again. The
// server refuses it team-b's stream, and the refusal shows on the connection alone: each
// minute's sweep waited out its look-up's bound for the replies, its Fetch with it, and said
// only that the look-up's deadline passed. It says once that the server refused it, naming the
// grant it lacks, and asks no more.
func TestSweepRefusedARetiredTenantSaysSoOnce(t *testing.T) {
	t.Parallel()
	cfg := config.Config{}.WithDefaults().NATS
	cfg.AckWait = config.Duration(time.Second)
	teamB := queue.JobStream(cfg, "team-b")
	conn := serverDenyingWorker(t, "$JS.API.STREAM.INFO."+teamB, "$JS.API.CONSUMER.*."+teamB+".>",
		"$JS.API.CONSUMER.*."+cfg.Stream+"."+cfg.Consumer+"-team-b")
	b := start(t, conn("op"), cfg)
	old, _, d := b.fetchedByOldWorker(t)
	if _, err := old.UpdateStatus(t.Context(), d.Ref(), func(s *job.Status) { s.State, s.Attempt = job.StateRunning, d.Attempt }, queue.ByAttempt(d.Attempt)); err != nil {
		t.Fatal(err)
	}
	b.declare(t, map[string]config.Tenant{"team-a": {}}) // team-b's running job is left to its run
	var log bytes.Buffer
	w := bundle{nc: conn("worker"), cfg: cfg}.open(t, cfg, map[string]config.Tenant{"team-a": {}}, &log)
	for range 2 {
		w.SweepNow()
		wait, cancel := context.WithTimeout(t.Context(), 300*time.Millisecond)
		_, _ = w.Fetch(wait)
		cancel()
	}
	said := log.String()
	if n := strings.Count(said, "tenant=team-b"); n != 1 || !strings.Contains(said, "refused") || !strings.Contains(said, "$JS.API.STREAM.INFO."+teamB) {
		t.Errorf("the worker's log says of team-b %d times; want once, that the server refused it $JS.API.STREAM.INFO.%s:\n%s", n, teamB, said)
	}
}
