package workercmd

import (
	"errors"
	"fmt"
	"testing"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/boxcar-run/boxcar/internal/queue"
)

// A worker starting while one server of its NATS cluster is down (a rolling restart) was told
// "no suitable peers for placement", a 400, by its first declare, and exited; the faults
// harness's cluster run saw one worker of two exit so. It waits for the server now, as for one
// that answers 503; a JetStream answer that no wait changes still stops it.
func TestQueueFatal(t *testing.T) {
	t.Parallel()
	api := func(code int, errCode jetstream.ErrorCode, text string) error {
		return fmt.Errorf("queue: set up dead-letter stream BOXCAR_DLQ: %w", &jetstream.APIError{Code: code, ErrorCode: errCode, Description: text})
	}
	for _, c := range []struct {
		name  string
		err   error
		fatal bool
	}{
		{"no suitable peers, a server down", api(400, jsNoPeers, "no suitable peers for placement"), false},
		{"temporarily unavailable", api(503, 10008, "JetStream system temporarily unavailable"), false},
		{"insufficient resources", api(503, 10023, "insufficient resources"), false},
		{"a setting no wait changes", api(400, 10058, "stream name already in use with a different configuration"), true},
		{"missing for a worker that may not declare", fmt.Errorf("bind: %w", queue.ErrNotReady), true},
		{"no answer", errors.New("context deadline exceeded"), false},
	} {
		if got := queueFatal(c.err); got != c.fatal {
			t.Errorf("%s: queueFatal(%v) = %v, want %v", c.name, c.err, got, c.fatal)
		}
	}
}
