package bench_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/boxcar-run/boxcar/internal/agent"
	"github.com/boxcar-run/boxcar/internal/config"
	"github.com/boxcar-run/boxcar/internal/job"
	"github.com/boxcar-run/boxcar/internal/metrics"
	"github.com/boxcar-run/boxcar/internal/pool"
	"github.com/boxcar-run/boxcar/internal/queue"
	"github.com/boxcar-run/boxcar/internal/runner"
	"github.com/boxcar-run/boxcar/internal/sandbox"
	"github.com/boxcar-run/boxcar/internal/store"
	"github.com/boxcar-run/boxcar/test/harness"
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
	m         *metrics.Metrics
	pm        *pool.Metrics
	pool      *pool.Pool
	sandboxes *sandbox.BubblewrapProvider
	store     *countingStore
	runNC     *nats.Conn
	stop      func()
	jobs      func() float64
}

// countingStore is a store that keeps nothing, counting the calls the runner makes (each one a
// round trip to a real store) and adding up the phases of the manifests it is given.
type countingStore struct {
	memStore
	ops    atomic.Int64
	mu     sync.Mutex
	phases map[string]int64 // milliseconds, over all manifests
	runs   int
}

func (s *countingStore) Put(ctx context.Context, key string, r io.Reader, size int64) error {
	s.ops.Add(1)
	return s.memStore.Put(ctx, key, r, size)
}

func (s *countingStore) PutIfAbsent(ctx context.Context, key string, r io.Reader, size int64) error {
	s.ops.Add(1)
	if !strings.HasSuffix(key, "/manifest.json") {
		return s.memStore.PutIfAbsent(ctx, key, r, size)
	}
	var m struct {
		Predicate struct {
			Usage struct {
				PhasesMS map[string]int64 `json:"phases_ms"`
			} `json:"usage"`
		} `json:"predicate"`
	}
	if err := json.NewDecoder(r).Decode(&m); err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for k, v := range m.Predicate.Usage.PhasesMS {
		s.phases[k] += v
	}
	s.runs++
	return nil
}

func (s *countingStore) Stat(ctx context.Context, key string) (store.ObjectInfo, error) {
	s.ops.Add(1)
	return s.memStore.Stat(ctx, key)
}

func (s *countingStore) Get(ctx context.Context, key string) (io.ReadCloser, error) {
	s.ops.Add(1)
	return s.memStore.Get(ctx, key)
}

func (s *countingStore) Delete(ctx context.Context, key string) error {
	s.ops.Add(1)
	return s.memStore.Delete(ctx, key)
}

// reportPhases reports each phase's mean wall time per job since the last reset.
func (s *countingStore) reportPhases(b *testing.B) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for k, v := range s.phases {
		b.ReportMetric(float64(v)/float64(max(s.runs, 1)), k+"-ms/job")
	}
}

func (s *countingStore) reset() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.phases, s.runs = map[string]int64{}, 0
	s.ops.Store(0)
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
	w := &warmWorker{m: metrics.New(), pm: pool.NewMetrics(prometheus.NewRegistry()), runNC: runNC, sandboxes: sandboxes,
		store: &countingStore{phases: map[string]int64{}}}
	w.pool, err = pool.New(pool.Config{Provider: sandboxes, Profiles: rg.cfg.Profiles, Slots: rg.cfg.Concurrency,
		Lag: pool.QueueLag(lagQ.ConsumerLag), Tenants: rg.cfg.TenantsOrDefault(), Metrics: w.pm, Logger: discardJSON()})
	if err != nil {
		b.Fatal(err)
	}
	r, err := runner.New(runner.Config{
		Worker: rg.cfg, Queue: runQ, Sandboxes: sandboxes, Pool: w.pool, Store: w.store, Agent: trueAgent{},
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
	harness.Wait(b, fmt.Sprintf("%v jobs succeeded", n), func() (bool, error) {
		done := w.jobs()
		return done >= n, fmt.Errorf("%v succeeded", done)
	}, harness.Within(5*time.Minute), harness.Every(time.Millisecond)) // the wait is in the figure
}

// BenchmarkWarmJobs is row 15: trivial jobs (one `true` in a real bubblewrap sandbox) per
// second through a worker of 4 slots with a warm pool, end to end (fetch, claim, run, commit to
// a store that keeps nothing, close, ack), against the raw fetch-and-double-ack loop on a stream
// of the same configuration on a second embedded server, and against the sandbox alone (as
// many goroutines as slots, each starting a sandbox, running `true` in it and closing it: the
// ceiling of any loop that gives each job a new sandbox), in alternating batches of 5 jobs a
// slot, so that the slots stay busy. nats-msgs/job counts what the worker's queue connection
// sends per job (requests and acks: the round trips), the pool's lag lookups apart;
// store-ops/job the store calls; <phase>-ms/job the phases of the manifests' usage records
// (the sandbox's close and the final status write and ack come after the manifest). The
// round trips and the guarantee each one serves are listed in docs/performance.md.
func BenchmarkWarmJobs(b *testing.B) {
	rg := newRig(b, warmConfig)
	w := startWarmWorker(b, rg)
	rawRig := newRig(b, warmConfig) // its own server: the worker would take the raw loop's messages
	ctx := b.Context()
	slots := rg.cfg.Concurrency
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
	bare := func(n int) time.Duration {
		start := time.Now()
		sandboxOnly(b, w.sandboxes, rg.cfg.Profiles["p"].Sandbox, slots, n)
		return time.Since(start)
	}
	boxcar(slots)
	raw(slots)
	bare(slots)
	out0 := w.runNC.Stats().OutMsgs
	hits0, misses0 := testutil.ToFloat64(w.pm.Hits.WithLabelValues("p")), testutil.ToFloat64(w.pm.Misses.WithLabelValues("p"))
	w.store.reset()
	var tBoxcar, tRaw, tBare time.Duration
	b.ResetTimer()
	for n := 0; n < b.N; {
		k := min(5*slots, b.N-n)
		tRaw += raw(k)
		tBoxcar += boxcar(k)
		tBare += bare(k)
		n += k
	}
	b.StopTimer()
	hits := testutil.ToFloat64(w.pm.Hits.WithLabelValues("p")) - hits0
	misses := testutil.ToFloat64(w.pm.Misses.WithLabelValues("p")) - misses0
	w.stop()
	b.ReportMetric(float64(b.N)/tBoxcar.Seconds(), "boxcar-jobs/s")
	b.ReportMetric(float64(b.N)/tRaw.Seconds(), "raw-jobs/s")
	b.ReportMetric(tRaw.Seconds()/tBoxcar.Seconds(), "x-of-raw")
	b.ReportMetric(float64(b.N)/tBare.Seconds(), "sandbox-jobs/s")
	b.ReportMetric(tBare.Seconds()/tBoxcar.Seconds(), "x-of-sandbox")
	b.ReportMetric(float64(w.runNC.Stats().OutMsgs-out0)/float64(b.N), "nats-msgs/job")
	b.ReportMetric(float64(w.store.ops.Load())/float64(b.N), "store-ops/job")
	b.ReportMetric(misses/(hits+misses), "cold-fraction")
	w.store.reportPhases(b)
}

// sandboxOnly runs n sandbox lives (Start, Exec `true`, Close), slots of them at a time.
func sandboxOnly(b *testing.B, p sandbox.Provider, spec config.SandboxSpec, slots, n int) {
	b.Helper()
	var (
		wg   sync.WaitGroup
		next atomic.Int64
		errs = make(chan error, slots)
	)
	for range slots {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for next.Add(1) <= int64(n) {
				sb, err := p.Start(context.Background(), sandbox.Spec{JobID: job.NewID(), SandboxSpec: spec})
				if err != nil {
					errs <- err
					return
				}
				res, err := sb.Exec(context.Background(), sandbox.ExecRequest{Argv: []string{"true"}, Timeout: 30 * time.Second})
				if err == nil && res.ExitCode != 0 {
					err = fmt.Errorf("true exited %d: %s", res.ExitCode, res.Stderr)
				}
				if cerr := sb.Close(context.Background()); err == nil {
					err = cerr
				}
				if err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		b.Fatalf("sandbox alone: %v", err)
	}
}

// BenchmarkWarmBurst is row 16: 50 jobs submitted at once onto an idle worker (4 slots) whose
// pool minimum is 0, so that it holds no sandbox when they come. It reports the fraction of
// jobs that started cold, overall and among those that took their sandbox a second or more
// after the first submission and among those after the first one a slot (the first jobs find
// the pool empty: its minimum is 0; under load, publishing 50 jobs can take a second), the
// pool's peak while the burst took sandboxes and the time from the first submission to it,
// and the time until all 50 succeeded. The pool holds warm sandboxes only in free slots (warm
// and taken together stay within the worker's 4), so while all slots are busy its size is 0
// or 1: a sandbox is started when a job gives its slot back, for the next job.
func BenchmarkWarmBurst(b *testing.B) {
	for range b.N {
		rg := newRig(b, warmConfig)
		w := startWarmWorker(b, rg)
		size := w.pm.Size.WithLabelValues("p")
		var (
			peak         float64
			peakAt       time.Duration
			hits1, miss1 float64 // at 1 s
			snapped      bool
			hitsS, missS float64 // once the first jobs, one a slot, had theirs
			snappedS     bool
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
				if h, m := testutil.ToFloat64(w.pm.Hits.WithLabelValues("p")), testutil.ToFloat64(w.pm.Misses.WithLabelValues("p")); !snappedS && h+m >= float64(rg.cfg.Concurrency) {
					hitsS, missS, snappedS = h, m, true
				}
				if !snapped && time.Since(start) >= time.Second {
					hits1, miss1 = testutil.ToFloat64(w.pm.Hits.WithLabelValues("p")), testutil.ToFloat64(w.pm.Misses.WithLabelValues("p"))
					snapped = true
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
		if !snapped { // every job had its sandbox within the first second
			hits1, miss1 = hits, misses
		}
		if later := hits + misses - hits1 - miss1; later > 0 {
			b.ReportMetric((misses-miss1)/later, "cold-after-1s")
		}
		b.ReportMetric(hits+misses-hits1-miss1, "jobs-after-1s")
		if later := hits + misses - hitsS - missS; snappedS && later > 0 {
			b.ReportMetric((misses-missS)/later, "cold-after-first-slots")
		}
		b.ReportMetric(peak, "pool-peak")
		b.ReportMetric(ms(peakAt), "ms-to-peak")
		b.ReportMetric(ms(total), "ms-for-50")
	}
}
