package queue_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/boxcar-run/boxcar/internal/config"
	"github.com/boxcar-run/boxcar/internal/job"
	"github.com/boxcar-run/boxcar/internal/queue"
	"github.com/boxcar-run/boxcar/test/harness"
)

func streamConfig(t *testing.T, js jetstream.JetStream, name string) jetstream.StreamConfig {
	t.Helper()
	s, err := js.Stream(context.Background(), name)
	if err != nil {
		t.Fatal(err)
	}
	return s.CachedInfo().Config
}

// edit changes a stream as `nats stream edit` does: the current config with one change.
func edit(t *testing.T, js jetstream.JetStream, name string, change func(*jetstream.StreamConfig)) {
	t.Helper()
	c := streamConfig(t, js, name)
	change(&c)
	if _, err := js.UpdateStream(context.Background(), c); err != nil {
		t.Fatalf("edit stream %s: %v", name, err)
	}
}

// TestOperatorStreamEditsAreKept: limits an operator sets with `nats stream edit` survive the
// next worker start, which says in its log that it keeps them.
func TestOperatorStreamEditsAreKept(t *testing.T) {
	t.Parallel()
	b := setup(t)
	jobs := queue.JobStream(b.cfg, tenant)
	edit(t, b.js, jobs, func(c *jetstream.StreamConfig) { c.MaxMsgs = 500 })
	edit(t, b.js, b.cfg.DeadLetterStream, func(c *jetstream.StreamConfig) { c.MaxAge = time.Hour })

	var log bytes.Buffer
	b.open(t, b.cfg, nil, &log)
	if got := streamConfig(t, b.js, jobs).MaxMsgs; got != 500 {
		t.Errorf("after a worker start the job stream's max_msgs = %d, want the operator's 500", got)
	}
	if got := streamConfig(t, b.js, b.cfg.DeadLetterStream).MaxAge; got != time.Hour {
		t.Errorf("after a worker start the dead-letter stream's max_age = %s, want the operator's 1h", got)
	}
	for _, want := range []string{"stream=" + jobs + " setting=max_msgs value=500", "stream=" + b.cfg.DeadLetterStream + " setting=max_age value=1h0m0s"} {
		if !strings.Contains(log.String(), "keeping a stream limit an operator changed") || !strings.Contains(log.String(), want) {
			t.Errorf("worker log does not say it keeps %q:\n%s", want, log.String())
		}
	}
}

// TestStreamEditsMadeBeforeTheWorkerRecordedItsLimits: a stream that a worker without
// retention settings made (the dead-letter stream), then edited by an operator, keeps the
// edit; what that worker set is replaced by the new defaults.
func TestStreamEditsMadeBeforeTheWorkerRecordedItsLimits(t *testing.T) {
	t.Parallel()
	cfg := config.Config{}.WithDefaults().NATS
	b := bundle{nc: connect(t, false), cfg: cfg}
	b.js = jetStream(t, b.nc)
	// As such a worker made it, with the operator's max_bytes.
	if _, err := b.js.CreateStream(t.Context(), jetstream.StreamConfig{Name: cfg.DeadLetterStream, Subjects: []string{cfg.DeadLetterStream + ".>"},
		Storage: jetstream.FileStorage, MaxAge: 30 * 24 * time.Hour, MaxBytes: 5 << 20, Discard: jetstream.DiscardOld}); err != nil {
		t.Fatal(err)
	}
	cfg.DeadLetterMaxAge = config.Duration(48 * time.Hour)
	b.open(t, cfg, nil, nil)
	c := streamConfig(t, b.js, cfg.DeadLetterStream)
	if c.MaxBytes != 5<<20 || c.MaxAge != 48*time.Hour {
		t.Errorf("dead-letter stream: max_bytes %d, max_age %s; want the operator's %d, the config's 48h", c.MaxBytes, c.MaxAge, 5<<20)
	}
}

// TestRetentionLimitsFollowTheConfig: the defaults bound every stream and the status bucket,
// and a changed config is applied to what no operator edited.
func TestRetentionLimitsFollowTheConfig(t *testing.T) {
	t.Parallel()
	b := setup(t)
	jobs := streamConfig(t, b.js, queue.JobStream(b.cfg, tenant))
	if jobs.MaxMsgs != 100_000 || jobs.MaxBytes != 1<<30 || jobs.Discard != jetstream.DiscardNew {
		t.Errorf("job stream: max_msgs %d, max_bytes %d, discard %s; want 100000, 1 GiB, new", jobs.MaxMsgs, jobs.MaxBytes, jobs.Discard)
	}
	dead := streamConfig(t, b.js, b.cfg.DeadLetterStream)
	if dead.MaxAge != 30*24*time.Hour || dead.MaxBytes != 1<<30 {
		t.Errorf("dead-letter stream: max_age %s, max_bytes %d; want 720h, 1 GiB", dead.MaxAge, dead.MaxBytes)
	}
	if ttl := streamConfig(t, b.js, "KV_"+queue.StatusBucket(b.cfg, tenant)).MaxAge; ttl != 7*24*time.Hour {
		t.Errorf("status bucket expiry = %s, want 168h", ttl)
	}

	cfg := b.cfg
	cfg.JobMaxBytes, cfg.DeadLetterMaxAge, cfg.StatusTTL = 64<<20, config.Duration(48*time.Hour), config.Duration(24*time.Hour)
	var log bytes.Buffer
	b.open(t, cfg, nil, &log)
	if got := streamConfig(t, b.js, queue.JobStream(b.cfg, tenant)).MaxBytes; got != 64<<20 {
		t.Errorf("job stream max_bytes after a config change = %d, want %d", got, 64<<20)
	}
	if got := streamConfig(t, b.js, b.cfg.DeadLetterStream).MaxAge; got != 48*time.Hour {
		t.Errorf("dead-letter max_age after a config change = %s, want 48h", got)
	}
	if got := streamConfig(t, b.js, "KV_"+queue.StatusBucket(b.cfg, tenant)).MaxAge; got != 24*time.Hour {
		t.Errorf("status expiry after a config change = %s, want 24h", got)
	}
	if strings.Contains(log.String(), "keeping") {
		t.Errorf("a config change was taken for an operator's edit:\n%s", log.String())
	}
}

// TestStatusExpiresAfterTheJobEnds: status_ttl after a job's last status change, its status is
// gone.
func TestStatusExpiresAfterTheJobEnds(t *testing.T) {
	t.Parallel()
	b := setup(t, func(c *config.NATS) { c.StatusTTL = config.Duration(time.Second) })
	ctx := context.Background()
	j := b.submit(t)
	d := fetch(t, b.w, 10*time.Second)
	if _, err := b.w.UpdateStatus(ctx, d.Ref(), func(s *job.Status) { s.State = job.StateSucceeded }); err != nil {
		t.Fatal(err)
	}
	if err := d.Ack(ctx); err != nil {
		t.Fatal(err)
	}
	harness.Wait(t, "the status of a job that ended gone (status_ttl 1s)", func() (bool, error) {
		st, err := b.c.Status(ctx, j.ID)
		return errors.Is(err, queue.ErrUnknownJob), fmt.Errorf("status %+v, %v", st, err)
	}, harness.Within(30*time.Second))
}

// TestFullJobStreamRefusesTheSubmission: past job_max_msgs a publish is refused, and the jobs
// already queued stay.
func TestFullJobStreamRefusesTheSubmission(t *testing.T) {
	t.Parallel()
	b := setup(t, func(c *config.NATS) { c.JobMaxMsgs = 2 })
	ctx := context.Background()
	for i := range 3 {
		j := newJob(t)
		_, err := b.c.Publish(ctx, j)
		if i < 2 && err != nil {
			t.Fatalf("publish %d: %v", i+1, err)
		}
		if i == 2 {
			if err == nil || !strings.Contains(err.Error(), "maximum messages") {
				t.Fatalf("publish past job_max_msgs: %v, want the server's refusal", err)
			}
			if st, err := b.c.Status(ctx, j.ID); !errors.Is(err, queue.ErrUnknownJob) {
				t.Errorf("status of the refused job = %+v, %v; want none", st, err)
			}
		}
	}
	for range 2 {
		if err := fetch(t, b.w, 10*time.Second).Ack(ctx); err != nil {
			t.Fatal(err)
		}
	}
}
