package queue_test

import (
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/boxcar-run/boxcar/internal/config"
	"github.com/boxcar-run/boxcar/internal/queue"
	"github.com/boxcar-run/boxcar/test/harness"
)

// TestAckWaitIsTheConsumers: a tenant's ack deadline is its consumer's on the server, as
// `worker setup` declared it, like its max_concurrent. A worker whose config says otherwise
// neither rewrites it (two such workers would change it back and forth, each one's heartbeats
// too rare for the other's deadline) nor keeps a job alive by its own: its heartbeats follow
// the server's deadline, so a running job is not delivered again. It says what differs.
func TestAckWaitIsTheConsumers(t *testing.T) {
	t.Parallel()
	const serverWait = 3 * time.Second // heartbeats every second: two to spare on a busy machine
	for _, tt := range []struct {
		name    string
		declare bool // the worker's identity may declare (queue.Open), or binds only
	}{
		{name: "worker that may declare", declare: true},
		{name: "worker that binds", declare: false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			nc := connect(t, false)
			ctx := t.Context()
			cfg := config.Config{}.WithDefaults().NATS
			cfg.AckWait = config.Duration(serverWait)
			admin, err := queue.NewAdmin(nc, cfg, nil, slog.New(slog.DiscardHandler))
			if err != nil {
				t.Fatal(err)
			}
			if err := admin.Declare(ctx); err != nil {
				t.Fatal(err)
			}

			mine := cfg
			mine.AckWait = config.Duration(10 * time.Minute) // heartbeats every 200 s by this alone
			var log harness.LogBuffer
			logger := slog.New(slog.NewTextHandler(&log, nil))
			var w *queue.Consumer
			if tt.declare {
				w, err = queue.Open(ctx, nc, mine, nil, logger)
			} else {
				w, err = queue.NewConsumer(ctx, nc, mine, nil, logger, nil)
			}
			if err != nil {
				t.Fatal(err)
			}
			cons, err := jetStream(t, nc).Consumer(ctx, queue.JobStream(cfg, tenant), cfg.Consumer+"-"+tenant)
			if err != nil {
				t.Fatal(err)
			}
			if got := cons.CachedInfo().Config.AckWait; got != serverWait {
				t.Fatalf("the consumer's ack wait is %s after the worker started, want setup's %s", got, serverWait)
			}
			if got := log.String(); !strings.Contains(got, "ack_wait") || !strings.Contains(got, "worker setup") {
				t.Errorf("the worker's log does not say its ack_wait differs from the server's and what to do:\n%s", got)
			}

			c, err := queue.NewClient(ctx, nc, cfg, tenant)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := c.Publish(ctx, newJob(t)); err != nil {
				t.Fatal(err)
			}
			d := fetch(t, w, 10*time.Second)
			stop := d.KeepAlive(ctx, 0)
			expectEmpty(t, w, 2*serverWait) // the job runs past the server's ack wait, not delivered again
			stop()
			if err := d.Ack(ctx); err != nil {
				t.Fatal(err)
			}
		})
	}
}
