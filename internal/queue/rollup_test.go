package queue_test

import (
	"encoding/json"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/boxcar-run/boxcar/internal/config"
	"github.com/boxcar-run/boxcar/internal/queue"
)

// TestDeclareNeverAllowsRollups: roll-ups let a writer of one key purge every tenant's keys of a
// bucket, so no bucket may allow them, not even for a moment while `worker setup` (or a worker
// that declares) brings the buckets to its config: an attacker publishing roll-ups in a loop
// would meet that moment. The server's audit of every JetStream API request shows each stream
// create and update Boxcar sends; none may allow roll-ups on a bucket that holds keys, and
// declaring again with the same config changes nothing.
func TestDeclareNeverAllowsRollups(t *testing.T) {
	t.Parallel()
	nc := connect(t, false)
	ctx := t.Context()
	cfg := config.Config{}.WithDefaults().NATS
	declare := func() {
		t.Helper()
		admin, err := queue.NewAdmin(nc, cfg, nil, slog.New(slog.DiscardHandler))
		if err != nil {
			t.Fatal(err)
		}
		if err := admin.Declare(ctx); err != nil {
			t.Fatal(err)
		}
	}
	declare() // the buckets are made; from here on they may hold keys
	js := jetStream(t, nc)
	for name := range js.StreamNames(ctx).Name() {
		s, err := js.Stream(ctx, name)
		if err != nil {
			t.Fatal(err)
		}
		if strings.HasPrefix(name, "KV_") && s.CachedInfo().Config.AllowRollup {
			t.Errorf("bucket %s allows roll-ups once declared", strings.TrimPrefix(name, "KV_"))
		}
	}

	var (
		mu      sync.Mutex
		updates []string
	)
	sub, err := nc.Subscribe("$JS.EVENT.ADVISORY.API", func(m *nats.Msg) {
		var audit struct{ Subject, Request string }
		if json.Unmarshal(m.Data, &audit) == nil && strings.HasPrefix(audit.Subject, "$JS.API.STREAM.UPDATE.KV_") {
			mu.Lock()
			updates = append(updates, audit.Subject+" "+audit.Request)
			mu.Unlock()
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = sub.Unsubscribe() }()
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}

	declare() // the same config: nothing to change
	cfg.Replicas = 1
	cfg.StatusTTL = config.Duration(2 * time.Duration(cfg.StatusTTL)) // a change that updates buckets
	declare()
	if err := nc.Flush(); err != nil { // the audits were published before the replies
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(updates) == 0 {
		t.Fatal("no bucket update seen after the expiry changed; the audit stream is not watched")
	}
	for _, u := range updates {
		if strings.Contains(u, `"allow_rollup_hdrs":true`) {
			t.Errorf("a bucket that holds keys was updated with roll-ups allowed: %s", u)
		}
	}
}

// TestDeclareTurnsRollupsOffOnEveryStream: a stream that allows roll-ups lets anyone who may
// publish one message to it purge the rest, so a job stream's submitter could drop every
// tenant's queued jobs with "Nats-Rollup: all" on a job of its own. Every stream Boxcar
// declares (the job stream, the dead letters, the buckets) has them off after `worker setup`,
// also where an older version or an operator turned them on.
func TestDeclareTurnsRollupsOffOnEveryStream(t *testing.T) {
	t.Parallel()
	nc := connect(t, false)
	ctx := t.Context()
	cfg := config.Config{}.WithDefaults().NATS
	admin, err := queue.NewAdmin(nc, cfg, nil, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	if err := admin.Declare(ctx); err != nil {
		t.Fatal(err)
	}
	js := jetStream(t, nc)
	var names []string
	for name := range js.StreamNames(ctx).Name() {
		names = append(names, name)
		s, err := js.Stream(ctx, name)
		if err != nil {
			t.Fatal(err)
		}
		on := s.CachedInfo().Config
		on.AllowRollup = true
		if _, err := js.UpdateStream(ctx, on); err != nil {
			t.Fatalf("turn roll-ups on for %s: %v", name, err)
		}
	}
	if len(names) < 3 {
		t.Fatalf("streams after declare: %v; want the job stream, the dead letters and the buckets", names)
	}
	if err := admin.Declare(ctx); err != nil {
		t.Fatal(err)
	}
	for _, name := range names {
		s, err := js.Stream(ctx, name)
		if err != nil {
			t.Fatal(err)
		}
		if s.CachedInfo().Config.AllowRollup {
			t.Errorf("stream %s still allows roll-ups after declare", name)
		}
	}
}
