// Package bench_test measures what Boxcar costs over the primitives it is built on. Every
// benchmark runs Boxcar and its baseline side by side in the same run, interleaved so that a
// busy machine slows both alike, and reports the ratio with b.ReportMetric. scripts/benchtable
// turns the output of `make bench` into one table.
package bench_test

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/boxcar-run/boxcar/internal/config"
	"github.com/boxcar-run/boxcar/internal/demomodel"
	"github.com/boxcar-run/boxcar/internal/job"
	"github.com/boxcar-run/boxcar/internal/queue"
	"github.com/boxcar-run/boxcar/internal/queue/queuetest"
	"github.com/boxcar-run/boxcar/internal/sandbox"
	"github.com/boxcar-run/boxcar/internal/store"
)

// rig is one embedded nats-server (file storage as `worker --embedded` runs it: no fsync per
// write) with Boxcar's stream, consumer and buckets set up from cfg.
type rig struct {
	cfg  config.Config
	srv  *server.Server
	nc   *nats.Conn
	js   jetstream.JetStream
	w    *queue.Consumer
	q    *queue.Client      // tenant default
	cons jetstream.Consumer // the same durable consumer the queue fetches from
}

func newRig(b *testing.B, yaml string) *rig {
	b.Helper()
	cfg, err := config.Parse([]byte(yaml))
	if err != nil {
		b.Fatal(err)
	}
	srv, nc := queuetest.Connect(b, queue.EmbeddedOptions{})
	ctx := context.Background()
	w, err := queue.Open(ctx, nc, cfg.NATS, nil, slog.New(slog.DiscardHandler))
	if err != nil {
		b.Fatal(err)
	}
	q, err := queue.NewClient(ctx, nc, cfg.NATS, "default")
	if err != nil {
		b.Fatal(err)
	}
	js, err := jetstream.New(nc)
	if err != nil {
		b.Fatal(err)
	}
	cons, err := js.Consumer(ctx, queue.JobStream(cfg.NATS, "default"), cfg.NATS.Consumer+"-default") // tenant default's
	if err != nil {
		b.Fatal(err)
	}
	return &rig{cfg: cfg, srv: srv, nc: nc, js: js, w: w, q: q, cons: cons}
}

func newJob(profile string) job.Job {
	return job.Job{Version: job.Version, ID: job.NewID(), Profile: profile, Task: "benchmark", SubmittedAt: time.Now().UTC()}
}

// publish submits n jobs as `submit` does (queued status, then the message) and returns them.
func (r *rig) publish(b *testing.B, profile string, n int) {
	b.Helper()
	for range n {
		if _, err := r.q.Publish(context.Background(), newJob(profile)); err != nil {
			b.Fatal(err)
		}
	}
}

// publishRaw puts n job messages on the stream with their ids and nothing else.
func (r *rig) publishRaw(b *testing.B, profile string, n int) {
	b.Helper()
	for range n {
		j := newJob(profile)
		data, err := j.Encode()
		if err != nil {
			b.Fatal(err)
		}
		if _, err := r.js.Publish(context.Background(), r.cfg.NATS.Subject+".default."+j.ID, data, jetstream.WithMsgID("default."+j.ID)); err != nil {
			b.Fatal(err)
		}
	}
}

// rawNext is the primitive fetch: the next message of the shared consumer.
func (r *rig) rawNext(b *testing.B) jetstream.Msg {
	b.Helper()
	msg, err := r.cons.Next(jetstream.FetchMaxWait(30 * time.Second))
	if err != nil {
		b.Fatalf("raw fetch: %v", err)
	}
	return msg
}

// discardJSON is the worker's JSON log handler writing nowhere: log lines are formatted as in
// production and their cost is counted.
func discardJSON() *slog.Logger { return slog.New(slog.NewJSONHandler(io.Discard, nil)) }

// searchableDir is a folder other users may pass through: sandboxes run as host uids of their own.
func searchableDir(b *testing.B) string {
	b.Helper()
	dir := b.TempDir()
	for _, d := range []string{filepath.Dir(dir), dir} {
		if err := os.Chmod(d, 0o711); err != nil {
			b.Fatal(err)
		}
	}
	return dir
}

// memStore is a store that keeps nothing: the queue-layer benchmark leaves storage out.
type memStore struct{}

var _ store.Store = memStore{}

func (memStore) Put(ctx context.Context, key string, r io.Reader, size int64) error {
	_, err := io.Copy(io.Discard, r)
	return err
}

func (memStore) PutIfAbsent(ctx context.Context, key string, r io.Reader, size int64) error {
	_, err := io.Copy(io.Discard, r)
	return err
}

func (memStore) Get(ctx context.Context, key string) (io.ReadCloser, error) {
	return nil, store.ErrNotFound
}

func (memStore) Stat(ctx context.Context, key string) (store.ObjectInfo, error) {
	return store.ObjectInfo{}, store.ErrNotFound
}

func (memStore) Delete(ctx context.Context, key string) error { return nil }
func (memStore) List(ctx context.Context, prefix string) ([]store.ObjectInfo, error) {
	return nil, nil
}
func (memStore) ListAtMost(ctx context.Context, prefix string, n int) ([]store.ObjectInfo, bool, error) {
	return nil, false, nil
}
func (memStore) URL(key string) string { return "mem://" + key }
func (memStore) Close() error          { return nil }

// nopSandbox runs nothing and holds no files.
type nopSandbox struct{}

var _ sandbox.Sandbox = nopSandbox{}

func (nopSandbox) Exec(ctx context.Context, req sandbox.ExecRequest) (sandbox.ExecResult, error) {
	return sandbox.ExecResult{}, nil
}
func (nopSandbox) WriteFile(ctx context.Context, name string, data []byte) error { return nil }
func (nopSandbox) WriteFrom(ctx context.Context, name string, r io.Reader, size int64) error {
	_, err := io.Copy(io.Discard, r)
	return err
}
func (nopSandbox) ReadFile(ctx context.Context, name string, max int64) ([]byte, error) {
	return nil, sandbox.ErrNotFound
}
func (nopSandbox) Open(ctx context.Context, name string, max int64) (io.ReadCloser, error) {
	return nil, sandbox.ErrNotFound
}
func (nopSandbox) List(ctx context.Context, dir string) ([]sandbox.FileInfo, error) {
	return nil, nil
}
func (nopSandbox) Info() sandbox.Info              { return sandbox.Info{Backend: "nop", ID: "nop"} }
func (nopSandbox) Close(ctx context.Context) error { return nil }

type nopProvider struct{}

func (nopProvider) Backend() string { return "nop" }
func (nopProvider) Start(ctx context.Context, spec sandbox.Spec) (sandbox.Sandbox, error) {
	return nopSandbox{}, nil
}

// scriptedModel is the demo model (internal/demomodel) playing script at zero latency: turn n
// of a job answers with the tool calls script[n-1], and after the script with the final
// answer. It keeps the request bodies of the last job, so a baseline can send the very same
// bytes. hold, when set, is waited on before every answer.
type scriptedModel struct {
	script [][]demomodel.Call
	hold   func(r *http.Request)

	mu     sync.Mutex
	bodies [][]byte
}

func (m *scriptedModel) start(b *testing.B) string {
	b.Helper()
	srv := httptest.NewServer(demomodel.HandlerWith(demomodel.Options{Script: m.script, Hold: m.received}))
	b.Cleanup(srv.Close)
	return srv.URL + "/v1"
}

// received keeps a request's body, a job's first request starting the list again, then holds
// it.
func (m *scriptedModel) received(r *http.Request, turn int, body []byte) {
	m.mu.Lock()
	if turn == 1 {
		m.bodies = m.bodies[:0]
	}
	m.bodies = append(m.bodies, body)
	m.mu.Unlock()
	if m.hold != nil {
		m.hold(r)
	}
}

// lastBodies are the request bodies of the last job, in order.
func (m *scriptedModel) lastBodies() [][]byte {
	m.mu.Lock()
	defer m.mu.Unlock()
	return slices.Clone(m.bodies)
}

// durations is a set of timings with the statistics the benchmarks report.
type durations []time.Duration

func (d durations) quantile(q float64) time.Duration {
	if len(d) == 0 {
		return 0
	}
	s := slices.Clone(d)
	slices.Sort(s)
	return s[min(int(q*float64(len(s))), len(s)-1)]
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
