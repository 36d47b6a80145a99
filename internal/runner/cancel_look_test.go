package runner

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"strings"
	"testing"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/boxcar-run/boxcar/internal/config"
	"github.com/boxcar-run/boxcar/internal/job"
	"github.com/boxcar-run/boxcar/internal/queue"
	"github.com/boxcar-run/boxcar/internal/queue/queuetest"
	"github.com/boxcar-run/boxcar/test/harness"
)

// TestFailedLookOfTheJobStreamIsTriedAgain: the watch releases the request of a job that ended
// (or never was) once its message is not in the job stream; a look at the stream that NATS
// fails keeps the request, and is tried again, with a wait growing after each failure, until
// NATS answers. Before, the request was kept and never looked at again (the watch went on to
// the next one): written with no expiry, it stayed in the bucket until some worker's watch
// started again, which only a broken connection or a worker's start does. The failure is the
// real server's: the tenant's job stream is gone (NATS lost it) while the watch looks, and is
// set up again after. (A reload of the server's permissions would refuse the look alone, but
// nats-server's reload races its direct gets, which the race detector reports.)
func TestFailedLookOfTheJobStreamIsTriedAgain(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		name  string
		ended bool // the job ran and ended; else its request names an id never submitted
	}{
		{name: "ended job", ended: true},
		{name: "id never submitted"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			_, nc := queuetest.Connect(t, queue.EmbeddedOptions{})
			cfg := config.Config{}.WithDefaults().NATS
			q, err := queue.Open(t.Context(), nc, cfg, nil, slog.New(slog.DiscardHandler))
			if err != nil {
				t.Fatal(err)
			}
			r := queue.Ref{Tenant: job.DefaultTenant, ID: job.NewID()}
			if tt.ended {
				if _, err := q.UpdateStatus(t.Context(), r, func(st *job.Status) { st.State = job.StateSucceeded }); err != nil {
					t.Fatal(err)
				}
			}
			js, err := jetstream.New(nc)
			if err != nil {
				t.Fatal(err)
			}
			kv, err := js.KeyValue(t.Context(), queue.CancelBucketOf(r.Tenant))
			if err != nil {
				t.Fatal(err)
			}
			key := r.Tenant + "." + r.ID
			if _, err := kv.Create(t.Context(), key, []byte(`{"at":"2026-01-01T00:00:00Z","by":"test"}`)); err != nil {
				t.Fatal(err)
			}

			if err := js.DeleteStream(t.Context(), queue.JobStream(cfg, r.Tenant)); err != nil {
				t.Fatal(err)
			}
			var log harness.LogBuffer
			ctx, cancel := context.WithCancel(context.Background())
			stopped := newCancelWatch(q, slog.New(slog.NewTextHandler(&log, nil))).start(ctx)
			defer func() { cancel(); <-stopped }()
			harness.Wait(t, "the watch to fail its look at the job stream", func() (bool, error) {
				return strings.Contains(log.String(), "cannot tell whether a job asked to be cancelled is queued"), errors.New(log.String())
			})
			if released(t, kv, key) {
				t.Fatal("the request was released while the watch could not tell whether the job's message is in the job stream")
			}
			admin, err := queue.NewAdmin(nc, cfg, nil, slog.New(slog.DiscardHandler))
			if err != nil {
				t.Fatal(err)
			}
			if err := admin.Declare(t.Context()); err != nil { // NATS has the stream again
				t.Fatal(err)
			}
			harness.Wait(t, "the watch to look again and release the request", func() (bool, error) {
				return released(t, kv, key), errors.New("the request is not released")
			})
		})
	}
}

// released reports whether the cancel request under key says it was released.
func released(t *testing.T, kv jetstream.KeyValue, key string) bool {
	t.Helper()
	e, err := kv.Get(t.Context(), key)
	if err != nil {
		t.Fatalf("read the cancel request: %v", err)
	}
	var req queue.CancelRequest
	if err := json.Unmarshal(e.Value(), &req); err != nil {
		t.Fatal(err)
	}
	return req.Released
}
