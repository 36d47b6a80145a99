package bench_test

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/boxcar-run/boxcar/internal/job"
	"github.com/boxcar-run/boxcar/internal/workercmd"
	"github.com/boxcar-run/boxcar/test/harness"
)

// workerEnv makes the test binary a worker: it runs workercmd as cmd/worker's main does, so
// the memory and failover benchmarks measure and kill real worker processes without building
// one inside a benchmark.
const workerEnv = "BOXCAR_BENCH_WORKER"

func TestMain(m *testing.M) {
	if os.Getenv(workerEnv) == "1" {
		os.Exit(runWorker())
	}
	os.Exit(m.Run())
}

func runWorker() int {
	ctx, cancel := context.WithCancel(context.Background())
	sigs := make(chan os.Signal, 2)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM)
	go func() {
		<-sigs
		cancel()
		<-sigs
		os.Exit(130)
	}()
	if err := workercmd.Run(ctx, os.Args[1:], os.Getenv, os.Stdout, os.Stderr); err != nil {
		fmt.Fprintln(os.Stderr, "worker:", err)
		return 1
	}
	return 0
}

// workerProc is one worker process: the test binary as a worker.
type workerProc struct{ *harness.Process }

// workerConfig is a worker's config file: the rig's NATS, a file store and bubblewrap root
// shared by the benchmark's workers, the model at modelURL, and profiles (YAML under
// "profiles:").
func workerConfig(rg *rig, id, dir, modelURL string, concurrency int, extra, profiles string) string {
	return fmt.Sprintf(`worker_id: %s
concurrency: %d
metrics_addr: "off"
%s
nats:
  url: %s
%s
store: {url: "file://%s/store"}
sandbox: {bubblewrap: {root: %s/sandboxes}}
model: {base_url: %q, max_retries: -1}
profiles:
%s`, id, concurrency, extra, rg.srv.ClientURL(), natsYAML(rg), dir, dir, modelURL, profiles)
}

// natsYAML repeats the rig's consumer settings, so that the workers do not change them.
func natsYAML(rg *rig) string {
	n := rg.cfg.NATS
	return fmt.Sprintf("  ack_wait: %s\n  max_deliver: %d\n  max_ack_pending: %d", n.AckWait.Std(), n.MaxDeliver, n.MaxAckPending)
}

// startWorker starts the test binary as a worker with config and waits until it is ready:
// until it writes its --ready-file.
func startWorker(b *testing.B, dir, name, config string) *workerProc {
	b.Helper()
	cfgPath := filepath.Join(dir, name+".yaml")
	if err := os.WriteFile(cfgPath, []byte(config), 0o600); err != nil {
		b.Fatal(err)
	}
	self, err := os.Executable()
	if err != nil {
		b.Fatal(err)
	}
	w := &workerProc{&harness.Process{Name: "worker " + name, Path: self, Args: []string{"--config", cfgPath, "--log-level", "warn"},
		Env: []string{workerEnv + "=1"}, Log: filepath.Join(dir, name+".log"), ReadyFile: filepath.Join(dir, name+".ready")}}
	// Not killed with the benchmark's context: stop ends it with SIGTERM, as an operator does.
	if err := w.Start(context.WithoutCancel(b.Context())); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { w.stop(b) })
	if _, err := w.WaitReady(b.Context(), harness.DefaultTimeout); err != nil {
		w.stop(b)
		data, _ := os.ReadFile(w.Log)
		b.Fatalf("%v:\n%s", err, data)
	}
	return w
}

// stop ends the worker with SIGTERM (SIGKILL after a minute) and waits for it.
func (w *workerProc) stop(b *testing.B) {
	if err := w.Stop(time.Minute); err != nil {
		b.Errorf("worker %d did not stop within a minute of SIGTERM: %v", w.Pid(), err)
	}
}

// memory reads the process's resident set and its peak from /proc: VmRSS and VmHWM.
func (w *workerProc) memory(b *testing.B) (rss, peak int64) {
	b.Helper()
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", w.Pid()))
	if err != nil {
		b.Fatal(err)
	}
	for _, line := range strings.Split(string(data), "\n") {
		k, v, ok := strings.Cut(line, ":")
		if !ok || (k != "VmRSS" && k != "VmHWM") {
			continue
		}
		kb, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
		if err != nil {
			b.Fatalf("/proc status %s: %v", line, err)
		}
		if k == "VmRSS" {
			rss = kb << 10
		} else {
			peak = kb << 10
		}
	}
	return rss, peak
}

// settled waits until the resident set has stopped moving after start-up (less than 64 KiB
// over half a second) and returns it.
func (w *workerProc) settled(b *testing.B) int64 {
	b.Helper()
	last, _ := w.memory(b)
	for range 40 {
		time.Sleep(500 * time.Millisecond)
		rss, _ := w.memory(b)
		if d := rss - last; d < 64<<10 && d > -64<<10 {
			return rss
		}
		last = rss
	}
	return last
}

// resetPeak sets the process's VmHWM back to its current RSS (proc(5), clear_refs "5").
func (w *workerProc) resetPeak(b *testing.B) {
	b.Helper()
	if err := os.WriteFile(fmt.Sprintf("/proc/%d/clear_refs", w.Pid()), []byte("5"), 0); err != nil {
		b.Fatalf("reset the peak RSS: %v", err)
	}
}

// gate holds every chat request until it is opened, and says when each arrives.
type gate struct {
	mu      sync.Mutex
	ch      chan struct{}
	arrived chan struct{}
}

func newGate() *gate {
	return &gate{ch: make(chan struct{}), arrived: make(chan struct{}, 1024)}
}

func (g *gate) hold(r *http.Request) {
	g.mu.Lock()
	ch := g.ch
	g.mu.Unlock()
	g.arrived <- struct{}{}
	select {
	case <-ch:
	case <-r.Context().Done():
	}
}

// open lets every held request and the next ones through; close holds the next ones again.
func (g *gate) open() {
	g.mu.Lock()
	defer g.mu.Unlock()
	select {
	case <-g.ch:
	default:
		close(g.ch)
	}
}

func (g *gate) close() {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.ch = make(chan struct{})
}

// await waits for n requests to arrive.
func (g *gate) await(b *testing.B, n int, within time.Duration) {
	b.Helper()
	deadline := time.After(within)
	for i := range n {
		select {
		case <-g.arrived:
		case <-deadline:
			b.Fatalf("%d of %d chat requests arrived within %s", i, n, within)
		}
	}
}

// drain forgets arrivals so far.
func (g *gate) drain() {
	for {
		select {
		case <-g.arrived:
		default:
			return
		}
	}
}

// awaitEnded waits until every job in ids has succeeded.
func (r *rig) awaitEnded(b *testing.B, ids []string, within time.Duration) {
	b.Helper()
	for _, id := range ids {
		harness.Wait(b, "job "+id+" to end", func() (bool, error) {
			st, err := r.q.Status(context.Background(), id)
			if err == nil && st.State.Terminal() && st.State != job.StateSucceeded {
				b.Fatalf("job %s ended %s: %s", id, st.State, st.Error)
			}
			return err == nil && st.State.Terminal(), fmt.Errorf("status %+v (%v)", st, err)
		}, harness.Within(within))
	}
}

// publishIDs submits n jobs as `submit` does and returns their ids.
func (r *rig) publishIDs(b *testing.B, profile string, n int) []string {
	b.Helper()
	var ids []string
	for range n {
		j := newJob(profile)
		if _, err := r.q.Publish(context.Background(), j); err != nil {
			b.Fatal(err)
		}
		ids = append(ids, j.ID)
	}
	return ids
}
