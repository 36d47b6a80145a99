package bench_test

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/boxcar-run/boxcar/internal/agent"
	"github.com/boxcar-run/boxcar/internal/job"
	"github.com/boxcar-run/boxcar/internal/metrics"
	"github.com/boxcar-run/boxcar/internal/queue"
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

// BenchmarkQueueLayer is row 1: jobs per second through a worker of one slot (runner.Run:
// fetch → run → settle), with a sandbox, model and store that do nothing, against the
// primitive loop on the same stream, consumer and storage: fetch the next message, double-ack
// it. Both run one job at a time, in alternating batches of 10; the worker fetches only while
// its batch is let through (gatedQueue), so the two never take each other's messages, and a
// batch is done when the worker has logged the ack of its last job. What Boxcar adds is its
// bookkeeping: the job's status in the KV bucket (running, outcome), the cancellation watch,
// heartbeats, decoding and validating the job, the manifest.
//
// The floor is a third loop in the same batches: the NATS requests the worker's guarantees
// need (the fetch, the status's create, its final write, the double-ack) and nothing else, the
// last two sent beside the next fetch as the worker settles. x-of-floor is what the runner's
// own work costs on top of its round trips; floor-x-of-raw is the most any worker making
// those round trips could reach (docs/performance.md).
func BenchmarkQueueLayer(b *testing.B) {
	rg := newRig(b, queueConfig)
	gate, acks := make(chan struct{}, 10), make(chan struct{}, 10)
	r, err := runner.New(runner.Config{
		Worker: rg.cfg, Queue: gatedQueue{rg.w, gate}, Sandboxes: nopProvider{}, Store: memStore{}, Agent: nopAgent{},
		Metrics: metrics.New(), Logger: slog.New(ackCounter{discardJSON().Handler(), acks}), ModelEndpoint: "http://127.0.0.1:1/v1",
	})
	if err != nil {
		b.Fatal(err)
	}
	ctx := b.Context()
	runCtx, stop := context.WithCancel(ctx)
	stopped := make(chan error, 1)
	go func() { stopped <- r.Run(runCtx) }()
	b.Cleanup(func() { stop(); <-stopped })
	var boxcarMsgs uint64 // what the worker's connection sends for Boxcar's jobs, fetch and ack included
	boxcar := func(n int) time.Duration {
		rg.publish(b, "p", n)
		out0, start := rg.nc.Stats().OutMsgs, time.Now()
		for range n {
			gate <- struct{}{}
		}
		for range n {
			select {
			case <-acks:
			case <-time.After(time.Minute):
				b.Fatal("no job acknowledged for a minute")
			}
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
	floor := rg.floorLoop(b)
	floor(5)
	boxcarMsgs = 0
	var tBoxcar, tRaw, tFloor time.Duration
	b.ResetTimer()
	for done := 0; done < b.N; {
		n := min(10, b.N-done)
		tRaw += raw(n)
		tBoxcar += boxcar(n)
		tFloor += floor(n)
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
	b.ReportMetric(tFloor.Seconds()/tBoxcar.Seconds(), "x-of-floor")
	b.ReportMetric(tRaw.Seconds()/tFloor.Seconds(), "floor-x-of-raw")
	b.ReportMetric(float64(boxcarMsgs)/float64(b.N), "nats-msgs/job")
}

// floorLoop returns the floor's loop: per job the fetch, the status create, and, beside the
// next job's, the final status write and the double-ack, one job settling at a time as in a
// worker of one slot. The statuses are the size of a Boxcar job's final one (the warm-up's),
// written in the tenant's status bucket under keys of their own.
func (rg *rig) floorLoop(b *testing.B) func(n int) time.Duration {
	b.Helper()
	ctx := b.Context()
	kv, err := rg.js.KeyValue(ctx, queue.StatusBucket(rg.cfg.NATS, "default"))
	if err != nil {
		b.Fatal(err)
	}
	status := finalStatus(b, kv)
	settled := make(chan error, 1)
	settled <- nil
	return func(n int) time.Duration {
		rg.publishRaw(b, "p", n)
		start := time.Now()
		for range n {
			msg := rg.rawNext(b)
			key := "floor." + job.NewID()
			rev, err := kv.Create(ctx, key, status)
			if err != nil {
				b.Fatal(err)
			}
			if err := <-settled; err != nil {
				b.Fatal(err)
			}
			go func() {
				if _, err := kv.Update(ctx, key, status, rev); err != nil {
					settled <- err
					return
				}
				settled <- msg.DoubleAck(ctx)
			}()
		}
		err := <-settled
		settled <- nil
		if err != nil {
			b.Fatal(err)
		}
		return time.Since(start)
	}
}

// finalStatus is the value of a status the worker wrote: the size the floor's writes take.
func finalStatus(b *testing.B, kv jetstream.KeyValue) []byte {
	b.Helper()
	keys, err := kv.ListKeys(b.Context())
	if err != nil {
		b.Fatal(err)
	}
	defer func() { _ = keys.Stop() }()
	key, ok := <-keys.Keys()
	if !ok {
		b.Fatal("the warm-up left no status to copy")
	}
	e, err := kv.Get(b.Context(), key)
	if err != nil {
		b.Fatal(err)
	}
	return e.Value()
}

// gatedQueue fetches a job only when the benchmark lets one through.
type gatedQueue struct {
	*queue.Consumer
	gate <-chan struct{}
}

func (q gatedQueue) Fetch(ctx context.Context) (*queue.Delivery, error) {
	select {
	case <-q.gate:
		return q.Consumer.Fetch(ctx)
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// ackCounter is a log handler that tells of each job the worker acknowledged: the last line of
// a job says how it was settled.
type ackCounter struct {
	slog.Handler
	acks chan<- struct{}
}

func (h ackCounter) Handle(ctx context.Context, rec slog.Record) error {
	if rec.Message == "job ack" {
		h.acks <- struct{}{}
	}
	return h.Handler.Handle(ctx, rec)
}

func (h ackCounter) WithAttrs(attrs []slog.Attr) slog.Handler {
	return ackCounter{h.Handler.WithAttrs(attrs), h.acks}
}

func (h ackCounter) WithGroup(name string) slog.Handler {
	return ackCounter{h.Handler.WithGroup(name), h.acks}
}
