package queue_test

import (
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/boxcar-run/boxcar/internal/job"
)

// BenchmarkJobRoundTrip is one job's queue overhead on file storage that fsyncs every write:
// publish (with its queued status), fetch, running status, double ack. BenchmarkCoreRequest, a plain NATS request/reply on the same
// server, is the baseline it is measured against.
func BenchmarkJobRoundTrip(b *testing.B) {
	bb := setup(b)
	ctx := context.Background()
	b.ResetTimer()
	for range b.N {
		j := job.Job{Version: job.Version, ID: job.NewID(), Profile: "p", Task: "t", SubmittedAt: time.Now().UTC()}
		if _, err := bb.c.Publish(ctx, j); err != nil {
			b.Fatal(err)
		}
		d, err := bb.w.Fetch(ctx)
		if err != nil {
			b.Fatal(err)
		}
		if _, err := bb.w.UpdateStatus(ctx, d.Ref(), func(s *job.Status) { s.State = job.StateRunning }); err != nil {
			b.Fatal(err)
		}
		if err := d.Ack(ctx); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkCoreRequest(b *testing.B) {
	nc := setup(b).nc
	sub, err := nc.Subscribe("bench.echo", func(m *nats.Msg) { _ = m.Respond(m.Data) })
	if err != nil {
		b.Fatal(err)
	}
	defer func() { _ = sub.Unsubscribe() }()
	payload := []byte(`{"version":1}`)
	b.ResetTimer()
	for range b.N {
		if _, err := nc.Request("bench.echo", payload, 5*time.Second); err != nil {
			b.Fatal(err)
		}
	}
}
