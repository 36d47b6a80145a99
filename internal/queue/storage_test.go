package queue_test

import (
	"context"
	"log/slog"
	"strings"
	"testing"

	"github.com/boxcar-run/boxcar/internal/config"
	"github.com/boxcar-run/boxcar/internal/queue"
)

// TestDeclareSaysWhatTheStorageLimitRefused: a server whose JetStream storage limit is below
// what the streams reserve refused setup with "insufficient storage resources available" alone,
// which says neither which limit nor what to change.
func TestDeclareSaysWhatTheStorageLimitRefused(t *testing.T) {
	t.Parallel()
	ns, err := queue.StartEmbedded(queue.EmbeddedOptions{MaxStore: 1 << 30, Port: -1, StoreDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ns.Shutdown(); ns.WaitForShutdown() })
	nc, err := queue.Connect(context.Background(), queue.ConnOptions{URL: ns.ClientURL(), Name: "test"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	admin, err := queue.NewAdmin(nc, config.Config{}.WithDefaults().NATS, nil, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	err = admin.Declare(t.Context())
	for _, want := range []string{"insufficient storage", "max_file_store", "nats.job_max_bytes", "2368 MiB a tenant"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("Declare on a server that may store 1 GiB = %v; want it to say %q", err, want)
		}
	}
}
