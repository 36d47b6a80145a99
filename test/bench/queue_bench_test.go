package bench_test

import (
	"context"
	"testing"
	"time"

	"github.com/boxcar-run/boxcar/internal/agent"
	"github.com/boxcar-run/boxcar/internal/metrics"
	"github.com/boxcar-run/boxcar/internal/runner"
)

const queueConfig = `
concurrency: 1
profiles:
  p:
    model: {name: bench-model}
    tools: [{name: read_file}]
`

// nopAgent answers at once, as a model that is done before it starts.
type nopAgent struct{}

func (nopAgent) Run(ctx context.Context, req agent.Request) (agent.Result, error) {
	return agent.Result{Outcome: agent.OutcomeCompleted, FinalMessage: "done", Turns: 1}, nil
}

// BenchmarkQueueLayer is row 1: jobs per second through Boxcar's fetch → run → ack, with a
// sandbox, model and store that do nothing, against the primitive loop on the same stream,
// consumer and storage: fetch the next message, double-ack it. Both run one job at a time, in
// alternating batches of 10. What Boxcar adds is its bookkeeping: the job's status in the KV
// bucket (running, progress, outcome), the cancellation watch, heartbeats, decoding and
// validating the job, the manifest.
func BenchmarkQueueLayer(b *testing.B) {
	rg := newRig(b, queueConfig)
	r, err := runner.New(runner.Config{
		Worker: rg.cfg, Queue: rg.w, Sandboxes: nopProvider{}, Store: memStore{}, Agent: nopAgent{},
		Metrics: metrics.New(), Logger: discardJSON(), ModelEndpoint: "http://127.0.0.1:1/v1",
	})
	if err != nil {
		b.Fatal(err)
	}
	ctx := b.Context()
	var boxcarMsgs uint64 // what the worker's connection sends for Boxcar's jobs, fetch and ack included
	boxcar := func(n int) time.Duration {
		rg.publish(b, "p", n)
		out0, start := rg.nc.Stats().OutMsgs, time.Now()
		for range n {
			d, err := rg.w.Fetch(ctx)
			if err != nil {
				b.Fatal(err)
			}
			r.Handle(ctx, d)
		}
		boxcarMsgs += rg.nc.Stats().OutMsgs - out0
		return time.Since(start)
	}
	raw := func(n int) time.Duration {
		rg.publishRaw(b, "p", n)
		start := time.Now()
		for range n {
			if err := rg.rawNext(b).DoubleAck(ctx); err != nil {
				b.Fatal(err)
			}
		}
		return time.Since(start)
	}
	boxcar(5) // warm up connections, buckets and caches
	raw(5)
	boxcarMsgs = 0
	var tBoxcar, tRaw time.Duration
	b.ResetTimer()
	for done := 0; done < b.N; {
		n := min(10, b.N-done)
		tRaw += raw(n)
		tBoxcar += boxcar(n)
		done += n
	}
	b.StopTimer()
	lags, err := rg.w.ConsumerLag(ctx)
	if err != nil {
		b.Fatal(err)
	}
	for _, l := range lags {
		if l.Pending != 0 || l.AckPending != 0 {
			b.Fatalf("jobs left on tenant %s's consumer: %d pending, %d unacknowledged", l.Tenant, l.Pending, l.AckPending)
		}
	}
	boxcarRate := float64(b.N) / tBoxcar.Seconds()
	rawRate := float64(b.N) / tRaw.Seconds()
	b.ReportMetric(boxcarRate, "boxcar-jobs/s")
	b.ReportMetric(rawRate, "raw-jobs/s")
	b.ReportMetric(boxcarRate/rawRate, "x-of-raw")
	b.ReportMetric(float64(boxcarMsgs)/float64(b.N), "nats-msgs/job")
}
