package bench_test

import (
	"context"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/boxcar-run/boxcar/internal/agent"
	"github.com/boxcar-run/boxcar/internal/metrics"
	"github.com/boxcar-run/boxcar/internal/pool"
	"github.com/boxcar-run/boxcar/internal/queue"
	"github.com/boxcar-run/boxcar/internal/runner"
	"github.com/boxcar-run/boxcar/internal/sandbox"
)

const warmConfig = `
concurrency: 4
profiles:
  p:
    model: {name: bench-model}
    tools: [{name: read_file}]
    warm: {min: 0, idle: 1m}
`

// trueAgent runs one `true` in the job's sandbox and is done: a trivial job that uses its
// sandbox.
type trueAgent struct{}

func (trueAgent) Run(ctx context.Context, req agent.Request) (agent.Result, error) {
	res, err := req.Sandbox.Exec(ctx, sandbox.ExecRequest{Argv: []string{"true"}, Timeout: 30 * time.Second})
	if err == nil && res.ExitCode != 0 {
		return agent.Result{}, context.Canceled
	}
	return agent.Result{Outcome: agent.OutcomeCompleted, FinalMessage: "done", Turns: 1}, err
}

// warmWorker is a runner and its warm pool over real bubblewrap sandboxes, running until the
// benchmark ends, each on a NATS connection of its own so that its messages can be counted.
type warmWorker struct {
	m     *metrics.Metrics
	pm    *pool.Metrics
	pool  *pool.Pool
	runNC *nats.Conn
	stop  func()
	jobs  func() float64
}

func startWarmWorker(b *testing.B, rg *rig) *warmWorker {
	b.Helper()
	sandboxes, err := sandbox.NewBubblewrap(sandbox.BubblewrapConfig{Root: searchableDir(b), Logger: discardJSON()})
	if err != nil {
		b.Fatalf("bubblewrap: %v (install it with `make deps-test`)", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	conn := func() (*nats.Conn, *queue.Consumer) {
		nc, err := queue.Connect(ctx, queue.ConnOptions{URL: rg.srv.ClientURL(), Name: "bench-worker"})
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(nc.Close)
		q, err := queue.Open(ctx, nc, rg.cfg.NATS, nil, slog.New(slog.DiscardHandler))
		if err != nil {
			b.Fatal(err)
		}
		return nc, q
	}
	runNC, runQ := conn()
	_, lagQ := conn()
	w := &warmWorker{m: metrics.New(), pm: pool.NewMetrics(prometheus.NewRegistry()), runNC: runNC}
	w.pool, err = pool.New(pool.Config{Provider: sandboxes, Profiles: rg.cfg.Profiles, Slots: rg.cfg.Concurrency,
		Lag: pool.ConsumerLag(lagQ.TotalLag), Metrics: w.pm, Logger: discardJSON()})
	if err != nil {
		b.Fatal(err)
	}
	r, err := runner.New(runner.Config{
		Worker: rg.cfg, Queue: runQ, Sandboxes: sandboxes, Pool: w.pool, Store: memStore{}, Agent: trueAgent{},
		Metrics: w.m, Logger: discardJSON(), ModelEndpoint: "http://127.0.0.1:1/v1",
	})
	if err != nil {
		b.Fatal(err)
	}
	var wg sync.WaitGroup
	wg.Add(2)
	go func() { defer wg.Done(); _ = w.pool.Run(ctx) }()
	go func() { defer wg.Done(); _ = r.Run(ctx) }()
	w.stop = sync.OnceFunc(func() { cancel(); wg.Wait() })
	b.Cleanup(w.stop)
	w.jobs = func() float64 { return testutil.ToFloat64(w.m.Jobs.WithLabelValues("p", "succeeded")) }
	return w
}

// waitJobs waits until n jobs have succeeded on the worker.
func (w *warmWorker) waitJobs(b *testing.B, n float64) {
	b.Helper()
	deadline := time.Now().Add(5 * time.Minute)
	for w.jobs() < n {
		if time.Now().After(deadline) {
			b.Fatalf("%v of %v jobs succeeded within 5 minutes", w.jobs(), n)
		}
		time.Sleep(time.Millisecond)
	}
}

// BenchmarkWarmJobs is row 15: trivial jobs (one `true` in a real bubblewrap sandbox) per
// second through a worker of 4 slots with a warm pool, end to end (fetch, claim, run, commit to
// a store that keeps nothing, close, ack), against the raw fetch-and-double-ack loop on a stream
// of the same configuration on a second embedded server, in alternating batches of 10. nats-msgs/job counts what the worker's queue
// connection sends per job (requests and acks: the round trips), the pool's lag lookups apart.
func BenchmarkWarmJobs(b *testing.B) {
	rg := newRig(b, warmConfig)
	w := startWarmWorker(b, rg)
	rawRig := newRig(b, warmConfig) // its own server: the worker would take the raw loop's messages
	ctx := b.Context()
	raw := func(n int) time.Duration {
		rawRig.publishRaw(b, "p", n)
		start := time.Now()
		for range n {
			if err := rawRig.rawNext(b).DoubleAck(ctx); err != nil {
				b.Fatal(err)
			}
		}
		return time.Since(start)
	}
	done := 0.0
	boxcar := func(n int) time.Duration {
		start := time.Now()
		rg.publish(b, "p", n)
		done += float64(n)
		w.waitJobs(b, done)
		return time.Since(start)
	}
	boxcar(4)
	raw(4)
	out0 := w.runNC.Stats().OutMsgs
	hits0, misses0 := testutil.ToFloat64(w.pm.Hits.WithLabelValues("p")), testutil.ToFloat64(w.pm.Misses.WithLabelValues("p"))
	var tBoxcar, tRaw time.Duration
	b.ResetTimer()
	for n := 0; n < b.N; {
		k := min(10, b.N-n)
		tRaw += raw(k)
		tBoxcar += boxcar(k)
		n += k
	}
	b.StopTimer()
	hits := testutil.ToFloat64(w.pm.Hits.WithLabelValues("p")) - hits0
	misses := testutil.ToFloat64(w.pm.Misses.WithLabelValues("p")) - misses0
	w.stop()
	b.ReportMetric(float64(b.N)/tBoxcar.Seconds(), "boxcar-jobs/s")
	b.ReportMetric(float64(b.N)/tRaw.Seconds(), "raw-jobs/s")
	b.ReportMetric(tRaw.Seconds()/tBoxcar.Seconds(), "x-of-raw")
	b.ReportMetric(float64(w.runNC.Stats().OutMsgs-out0)/float64(b.N), "nats-msgs/job")
	b.ReportMetric(misses/(hits+misses), "cold-fraction")
}

// BenchmarkWarmBurst is row 16: 50 jobs submitted at once onto an idle worker (4 slots) whose
// pool minimum is 0, so that it holds no sandbox when they come. It reports the fraction of
// jobs that started cold, the pool's peak while the burst took sandboxes and the time from the
// first submission to it, and the time until all 50 succeeded.
func BenchmarkWarmBurst(b *testing.B) {
	for range b.N {
		rg := newRig(b, warmConfig)
		w := startWarmWorker(b, rg)
		size := w.pm.Size.WithLabelValues("p")
		var (
			peak   float64
			peakAt time.Duration
		)
		sampled := make(chan struct{})
		stopSampling := make(chan struct{})
		start := time.Now()
		taken := func() float64 {
			return testutil.ToFloat64(w.pm.Hits.WithLabelValues("p")) + testutil.ToFloat64(w.pm.Misses.WithLabelValues("p"))
		}
		go func() { // until every job of the burst has its sandbox
			defer close(sampled)
			for taken() < 50 {
				if s := testutil.ToFloat64(size); s > peak {
					peak, peakAt = s, time.Since(start)
				}
				select {
				case <-stopSampling:
					return
				case <-time.After(time.Millisecond):
				}
			}
		}()
		rg.publish(b, "p", 50)
		w.waitJobs(b, 50)
		total := time.Since(start)
		close(stopSampling)
		<-sampled
		hits, misses := testutil.ToFloat64(w.pm.Hits.WithLabelValues("p")), testutil.ToFloat64(w.pm.Misses.WithLabelValues("p"))
		w.stop()
		b.ReportMetric(misses/(hits+misses), "cold-fraction")
		b.ReportMetric(peak, "pool-peak")
		b.ReportMetric(ms(peakAt), "ms-to-peak")
		b.ReportMetric(ms(total), "ms-for-50")
	}
}
