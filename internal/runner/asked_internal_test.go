package runner

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/boxcar-run/boxcar/internal/config"
	"github.com/boxcar-run/boxcar/internal/job"
	"github.com/boxcar-run/boxcar/internal/queue"
)

// TestAskedStaysWithinTheStatus: a job whose every tool call is an "ask" answered by an
// automated approver records each request in its status (job.Status.Asked), a NATS KV value
// the server refuses past its max_payload (1 MiB by default). With max_tool_calls at its most
// (config.MaxCalls) and call ids at their longest (128 characters), the status must still fit
// beside the largest labels a job may carry, or every later status write of the job fails.
// (It did not: 16384 requests made the status 3.6 MB.)
func TestAskedStaysWithinTheStatus(t *testing.T) {
	t.Parallel()
	const maxPayload = 1 << 20
	var s job.Status
	var last string
	at := time.Date(2026, 12, 7, 8, 0, 0, 0, time.UTC)
	for i := range config.MaxCalls {
		id := fmt.Sprintf("call_%d_%s", i, strings.Repeat("x", 128))[:128]
		last = id
		recordAsked(queue.Approval{CallID: id, Revision: uint64(1<<40 + i), ExpiresAt: at.Add(time.Duration(i) * time.Second)})(&s)
		if i%3 == 1 { // some the worker gave up on, never the last
			recordExpired(id)(&s)
		}
	}
	data, err := json.Marshal(s)
	if err != nil {
		t.Fatal(err)
	}
	if room := maxPayload - job.MaxMessageBytes; len(data) > room {
		t.Fatalf("status of %d requests asked: %d bytes, %d entries; want at most %d (max_payload less a job's labels)",
			config.MaxCalls, len(data), len(s.Asked), room)
	}
	// The request asked last, whose answer the next attempt may still reuse, is kept.
	if rec, ok := s.Asked[last]; !ok || rec.Expired {
		t.Errorf("the last request asked: %+v, %v; want it recorded", rec, ok)
	}
}
