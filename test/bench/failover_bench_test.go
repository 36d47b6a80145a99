package bench_test

import (
	"context"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/boxcar-run/boxcar/internal/queue"
)

const ackWait = 3 * time.Second

const failoverRig = `
nats: {ack_wait: 3s, max_deliver: 5}
profiles:
  p:
    model: {name: bench-model}
    tools: [{name: read_file}]
`

// BenchmarkFailover is row 5. SIGKILL: a worker process holding a job in its model call is
// killed; the time until a second, idle worker starts the job (its first chat request),
// against the primitive: a raw consumer that fetched a message and vanished, until the message
// reaches another fetch. SIGTERM: the same with SIGTERM (drain_grace 1ms: the job cannot
// finish, so it is handed back at once), against a raw Nak reaching another fetch. AckWait is
// 3s; heartbeats every second keep a live worker's job.
func BenchmarkFailover(b *testing.B) {
	rg := newRig(b, failoverRig)
	dir := searchableDir(b)
	model := &scriptedModel{}
	g := newGate()
	model.hold = g.hold
	url := model.start(b)
	config := func(id string) string {
		return workerConfig(rg, id, dir, url, 1, "drain_grace: 1ms", heldProfile)
	}
	ctx := context.Background()

	// rawHandover: a second connection fetches a message and gives it up with leave; the time
	// until the rig's own fetch gets it.
	rawHandover := func(leave func(jetstream.Msg, func())) time.Duration {
		rg.publishRaw(b, "p", 1)
		nc, err := queue.Connect(ctx, queue.ConnOptions{URL: rg.srv.ClientURL(), Name: "bench-raw"})
		if err != nil {
			b.Fatal(err)
		}
		js, err := jetstream.New(nc)
		if err != nil {
			b.Fatal(err)
		}
		cons, err := js.Consumer(ctx, queue.JobStream(rg.cfg.NATS, "default"), rg.cfg.NATS.Consumer+"-default")
		if err != nil {
			b.Fatal(err)
		}
		msg, err := cons.Next(jetstream.FetchMaxWait(30 * time.Second))
		if err != nil {
			b.Fatal(err)
		}
		start := time.Now()
		leave(msg, nc.Close)
		got, err := rg.cons.Next(jetstream.FetchMaxWait(ackWait + 30*time.Second))
		if err != nil {
			b.Fatalf("the message was not delivered again: %v", err)
		}
		elapsed := time.Since(start)
		nc.Close()
		if err := got.DoubleAck(ctx); err != nil {
			b.Fatal(err)
		}
		return elapsed
	}
	// handover: worker a holds a job in its model call, worker b is idle; stop ends a; the time
	// until b asks the model.
	handover := func(stop func(*workerProc)) time.Duration {
		g.close()
		a := startWorker(b, dir, "a", config("a"))
		ids := rg.publishIDs(b, "p", 1)
		g.await(b, 1, time.Minute)
		w := startWorker(b, dir, "b", config("b"))
		g.drain()
		start := time.Now()
		stop(a)
		g.await(b, 1, ackWait+time.Minute)
		elapsed := time.Since(start)
		g.open()
		rg.awaitEnded(b, ids, time.Minute)
		a.stop(b)
		w.stop(b)
		return elapsed
	}

	var kill, rawKill, term, rawNak durations
	for range b.N {
		rawKill = append(rawKill, rawHandover(func(_ jetstream.Msg, closeConn func()) { closeConn() }))
		kill = append(kill, handover(func(w *workerProc) { w.Kill() }))
		rawNak = append(rawNak, rawHandover(func(m jetstream.Msg, _ func()) {
			if err := m.Nak(); err != nil {
				b.Fatal(err)
			}
		}))
		term = append(term, handover(func(w *workerProc) { w.Signal(syscall.SIGTERM) }))
	}
	b.ReportMetric(ms(kill.quantile(0.5)), "sigkill-ms")
	b.ReportMetric(ms(kill.quantile(0.5)-ackWait), "sigkill-excess-ms")
	b.ReportMetric(ms(rawKill.quantile(0.5)), "raw-sigkill-ms")
	b.ReportMetric(float64(kill.quantile(0.5))/float64(rawKill.quantile(0.5)), "x-of-raw-sigkill")
	b.ReportMetric(ms(term.quantile(0.5)), "sigterm-ms")
	b.ReportMetric(ms(rawNak.quantile(0.5)), "raw-nak-ms")
	b.ReportMetric(float64(term.quantile(0.5))/float64(rawNak.quantile(0.5)), "x-of-raw-sigterm")
}
