package queue_test

import (
	"log/slog"
	"testing"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/boxcar-run/boxcar/internal/config"
	"github.com/boxcar-run/boxcar/internal/job"
	"github.com/boxcar-run/boxcar/internal/queue"
)

// TestLetterOfAMessageWithoutAJobIDIsWrittenOnce: a message an older Boxcar queued in the shared
// stream on a subject that names no job (boxcar.jobs.default.a.b) is dead-lettered by setup with
// no job id. publishOnce checked only a job id's subject for a letter there already, and every
// such letter shared one subject (~unknown): a setup that wrote the letter and could not remove
// the message (here the stream denies deletes) wrote a second at the next setup. Its letter is
// now under the message's sequence, stream-seq-N, the id a worker records such a message under,
// and its subject's tenant, and written once.
func TestLetterOfAMessageWithoutAJobIDIsWrittenOnce(t *testing.T) {
	t.Parallel()
	cfg := drainConfig()
	b, _ := olderSetup(t, cfg, func(c *jetstream.StreamConfig) { c.Subjects, c.DenyDelete = []string{cfg.Subject + ".>"}, true })
	ctx := t.Context()
	ack, err := b.js.Publish(ctx, cfg.Subject+"."+job.DefaultTenant+".a.b", []byte(`{"task":"t"}`), jetstream.WithExpectStream(cfg.Stream))
	if err != nil {
		t.Fatal(err)
	}
	admin, err := queue.NewAdmin(b.nc, cfg, map[string]config.Tenant{"team-a": {}}, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if err := admin.Declare(ctx); err != nil {
			t.Fatal(err)
		}
	}
	s, err := b.js.Stream(ctx, cfg.DeadLetterStream)
	if err != nil {
		t.Fatal(err)
	}
	if n := s.CachedInfo().State.Msgs; n != 1 {
		t.Errorf("%d dead letters of the one message; want 1", n)
	}
	r := queue.Ref{Tenant: job.DefaultTenant, ID: job.SeqID(ack.Sequence)}
	if _, err := queue.DeadLetterOf(ctx, b.nc, cfg, r); err != nil {
		t.Errorf("the letter under %s: %v", r.ID, err)
	}
}

// TestFirstSetupLettersWhatItRetires: the first `worker setup` on an older Boxcar's server (a
// shared job stream, no dead-letter stream yet) retired the jobs of tenants its config does not
// list before it declared the dead-letter streams: each letter found no stream, and every such
// job was left for the next setup. The dead-letter streams are declared first.
func TestFirstSetupLettersWhatItRetires(t *testing.T) {
	t.Parallel()
	cfg := drainConfig()
	b, _ := olderSetup(t, cfg, func(c *jetstream.StreamConfig) { c.Subjects = []string{cfg.Subject + ".*.*"} })
	ctx := t.Context()
	j := newJob(t)
	data, err := j.Encode()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.js.Publish(ctx, cfg.Subject+".team-b."+j.ID, data, jetstream.WithExpectStream(cfg.Stream)); err != nil {
		t.Fatal(err)
	}
	admin, err := queue.NewAdmin(b.nc, cfg, map[string]config.Tenant{"team-a": {}}, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	if err := admin.Declare(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := queue.DeadLetterOf(ctx, b.nc, cfg, queue.Ref{Tenant: "team-b", ID: j.ID}); err != nil {
		t.Errorf("team-b's job after the first setup: %v; want its unknown_tenant letter", err)
	}
}
