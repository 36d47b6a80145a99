package queue_test

import (
	"log/slog"
	"strings"
	"testing"

	"github.com/boxcar-run/boxcar/internal/config"
	"github.com/boxcar-run/boxcar/internal/queue"
	"github.com/boxcar-run/boxcar/internal/queue/queuetest"
)

// TestDeclareSaysWhatTheStorageLimitRefused: a server whose JetStream storage limit is below
// what the streams reserve refused setup with "insufficient storage resources available" alone,
// which says neither which limit nor what to change.
func TestDeclareSaysWhatTheStorageLimitRefused(t *testing.T) {
	t.Parallel()
	_, nc := queuetest.Connect(t, queue.EmbeddedOptions{MaxStore: 1 << 30})
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
