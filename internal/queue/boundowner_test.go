package queue_test

import (
	"bytes"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/boxcar-run/boxcar/internal/config"
	"github.com/boxcar-run/boxcar/internal/queue"
)

// TestJobStreamBoundHasOneOwner: once `worker setup` bounded a tenant's job stream, a worker
// whose config says otherwise keeps the stream's bound and warns naming both (setup's value
// and setting, its own), rather than setting its own at its start and undoing setup's until
// the next setup, and two such workers each other's. Where no setup ran, workers apply their
// config as before, and one that changes the bound another worker set says so, naming both.
func TestJobStreamBoundHasOneOwner(t *testing.T) {
	t.Parallel()
	b := setup(t)
	stream := queue.JobStream(b.cfg, "team-a")
	withLog := func() (*bytes.Buffer, *slog.Logger) {
		var buf bytes.Buffer
		return &buf, slog.New(slog.NewTextHandler(&buf, nil))
	}

	// No setup yet: a worker that disagrees with the one before changes the bound, and says so.
	five, six := b.cfg, b.cfg
	five.JobMaxMsgs, six.JobMaxMsgs = 5, 6
	teamA := map[string]config.Tenant{"team-a": {Profiles: []string{"p"}}}
	b.open(t, five, teamA, nil)
	var log bytes.Buffer
	b.open(t, six, teamA, &log)
	if got := streamConfig(t, b.js, stream).MaxMsgs; got != 6 {
		t.Errorf("team-a's bound after a worker of nats.job_max_msgs 6 started, no setup having run = %d, want 6", got)
	}
	if s := log.String(); !strings.Contains(s, "WARN") || !strings.Contains(s, `"5 (nats.job_max_msgs)"`) || !strings.Contains(s, `"6 (nats.job_max_msgs)"`) {
		t.Errorf("a worker that changed the bound another set logs\n%s\nwant a warning naming 5 and 6", s)
	}

	// Setup bounds it to 2; workers of other bounds keep that and warn.
	setupLog, logger := withLog()
	admin, err := queue.NewAdmin(b.nc, b.cfg, map[string]config.Tenant{"team-a": {Profiles: []string{"p"}, MaxQueued: 2}}, logger)
	if err != nil {
		t.Fatal(err)
	}
	if err := admin.Declare(t.Context()); err != nil {
		t.Fatalf("setup: %v\n%s", err, setupLog)
	}
	for _, w := range []struct {
		nats    config.NATS
		tenants map[string]config.Tenant
		own     string
	}{
		{five, teamA, `"5 (nats.job_max_msgs)"`},
		{b.cfg, map[string]config.Tenant{"team-a": {Profiles: []string{"p"}, MaxQueued: 3}}, `"3 (tenants.team-a.max_queued)"`},
	} {
		var log bytes.Buffer
		b.open(t, w.nats, w.tenants, &log)
		if got := streamConfig(t, b.js, stream).MaxMsgs; got != 2 {
			t.Errorf("team-a's bound after setup set 2 and a worker of %s started = %d, want setup's 2", w.own, got)
		}
		if s := log.String(); !strings.Contains(s, "WARN") || !strings.Contains(s, `"2 (tenants.team-a.max_queued)"`) || !strings.Contains(s, w.own) || !strings.Contains(s, "worker setup") {
			t.Errorf("a worker of %s logs\n%s\nwant a warning naming setup's 2 and its own, and worker setup", w.own, s)
		}
	}

	// A worker of setup's config says nothing.
	log.Reset()
	b.open(t, b.cfg, map[string]config.Tenant{"team-a": {Profiles: []string{"p"}, MaxQueued: 2}}, &log)
	if strings.Contains(log.String(), "limit=max_") {
		t.Errorf("a worker of setup's config warns:\n%s", log.String())
	}
}

// TestDeadLetterAndStatusBoundsHaveOneOwner: the dead-letter stream's limits and the status
// bucket's expiry are setup's as a job stream's bounds are (TestJobStreamBoundHasOneOwner).
// Before, whichever worker declared last set its own config's, silently: a worker of
// status_ttl 1h among workers of 7 days expired every job's status after an hour until the
// next start of another, and nothing said so.
func TestDeadLetterAndStatusBoundsHaveOneOwner(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		name, setting string
		stream        func(config.NATS) string
		set           func(*config.NATS, int64)
		get           func(jetstream.StreamConfig) int64
	}{
		{"dead-letter max_age", "nats.dead_letter_max_age", func(c config.NATS) string { return c.DeadLetterStream },
			func(c *config.NATS, h int64) { c.DeadLetterMaxAge = config.Duration(time.Duration(h) * time.Hour) },
			func(c jetstream.StreamConfig) int64 { return int64(c.MaxAge / time.Hour) }},
		{"dead-letter max_bytes", "nats.dead_letter_max_bytes", func(c config.NATS) string { return c.DeadLetterStream },
			func(c *config.NATS, n int64) { c.DeadLetterMaxBytes = n << 20 },
			func(c jetstream.StreamConfig) int64 { return c.MaxBytes >> 20 }},
		{"status_ttl", "nats.status_ttl", func(c config.NATS) string { return "KV_" + queue.StatusBucket(c, tenant) },
			func(c *config.NATS, h int64) { c.StatusTTL = config.Duration(time.Duration(h) * time.Hour) },
			func(c jetstream.StreamConfig) int64 { return int64(c.MaxAge / time.Hour) }},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			stream := tt.stream(b.cfg)
			with := func(n int64) config.NATS {
				c := b.cfg
				tt.set(&c, n)
				return c
			}
			says := func(n int64) string {
				s := (time.Duration(n) * time.Hour).String()
				if tt.name == "dead-letter max_bytes" {
					s = fmt.Sprint(with(n).DeadLetterMaxBytes)
				}
				return `"` + s + " (" + tt.setting + `)"`
			}

			// No setup: the later worker applies its config, and says whose value it changes.
			b.open(t, with(5), nil, nil)
			var log bytes.Buffer
			b.open(t, with(6), nil, &log)
			if got := tt.get(streamConfig(t, b.js, stream)); got != 6 {
				t.Errorf("%s of %s after a worker of 6 started, no setup having run = %d, want 6", tt.name, stream, got)
			}
			if s := log.String(); !strings.Contains(s, "WARN") || !strings.Contains(s, says(5)) || !strings.Contains(s, says(6)) {
				t.Errorf("a worker that changed the %s another set logs\n%s\nwant a warning naming %s and %s", tt.name, s, says(5), says(6))
			}

			// Setup sets 2; a worker of 5 keeps it and warns.
			admin, err := queue.NewAdmin(b.nc, with(2), nil, slog.New(slog.DiscardHandler))
			if err != nil {
				t.Fatal(err)
			}
			if err := admin.Declare(t.Context()); err != nil {
				t.Fatalf("setup: %v", err)
			}
			log.Reset()
			b.open(t, with(5), nil, &log)
			if got := tt.get(streamConfig(t, b.js, stream)); got != 2 {
				t.Errorf("%s of %s after setup set 2 and a worker of 5 started = %d, want setup's 2", tt.name, stream, got)
			}
			if s := log.String(); !strings.Contains(s, "WARN") || !strings.Contains(s, says(2)) || !strings.Contains(s, says(5)) || !strings.Contains(s, "worker setup") {
				t.Errorf("a worker of 5 logs\n%s\nwant a warning naming setup's %s, its own %s, and worker setup", s, says(2), says(5))
			}

			// A worker of setup's config says nothing.
			log.Reset()
			b.open(t, with(2), nil, &log)
			if strings.Contains(log.String(), "limit=") {
				t.Errorf("a worker of setup's config warns:\n%s", log.String())
			}
		})
	}
}
