package runner_test

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/goleak"

	"github.com/boxcar-run/boxcar/internal/agent"
	"github.com/boxcar-run/boxcar/internal/config"
	"github.com/boxcar-run/boxcar/internal/job"
	"github.com/boxcar-run/boxcar/internal/metrics"
	"github.com/boxcar-run/boxcar/internal/provenance"
	"github.com/boxcar-run/boxcar/internal/queue"
	"github.com/boxcar-run/boxcar/internal/queue/queuetest"
	"github.com/boxcar-run/boxcar/internal/runner"
	"github.com/boxcar-run/boxcar/internal/sandbox"
	"github.com/boxcar-run/boxcar/internal/spawn"
	"github.com/boxcar-run/boxcar/internal/store"
	"github.com/boxcar-run/boxcar/test/harness"
)

// fakeSandbox is an in-memory workdir; the runner only moves files through it.
type fakeSandbox struct {
	p      *fakeProvider
	mu     sync.Mutex
	files  map[string][]byte
	closed bool
}

func (s *fakeSandbox) Exec(ctx context.Context, req sandbox.ExecRequest) (sandbox.ExecResult, error) {
	return sandbox.ExecResult{}, errors.New("fake sandbox runs no commands")
}

func (s *fakeSandbox) WriteFile(ctx context.Context, name string, data []byte) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.files[name] = append([]byte(nil), data...)
	return nil
}

// WriteFrom keeps the file in memory like WriteFile: the fake's files are small.
func (s *fakeSandbox) WriteFrom(ctx context.Context, name string, r io.Reader, size int64) error {
	if s.p.writes != nil {
		s.p.writes(ctx, name)
	}
	data, err := io.ReadAll(io.LimitReader(r, size+1))
	switch {
	case err != nil:
		return err
	case int64(len(data)) > size:
		return sandbox.ErrTooLarge
	case int64(len(data)) < size:
		return io.ErrUnexpectedEOF
	}
	return s.WriteFile(ctx, name, data)
}

func (s *fakeSandbox) ReadFile(ctx context.Context, name string, max int64) ([]byte, error) {
	if s.p.readFails != nil {
		if err := s.p.readFails(name); err != nil {
			return nil, err
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	data, ok := s.files[name]
	if !ok {
		return nil, sandbox.ErrNotFound
	}
	if int64(len(data)) > max {
		return nil, sandbox.ErrTooLarge
	}
	return data, nil
}

func (s *fakeSandbox) Open(ctx context.Context, name string, max int64) (io.ReadCloser, error) {
	data, err := s.ReadFile(ctx, name, max)
	if err != nil {
		return nil, err
	}
	if s.p.reads != nil {
		return io.NopCloser(s.p.reads(ctx, name, data)), nil
	}
	return io.NopCloser(bytes.NewReader(data)), nil
}

func (s *fakeSandbox) List(ctx context.Context, dir string) ([]sandbox.FileInfo, error) {
	if s.p.listFails != nil {
		if err := s.p.listFails(dir); err != nil {
			return nil, err
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []sandbox.FileInfo
	for name, data := range s.files {
		if strings.HasPrefix(name, dir+"/") {
			out = append(out, sandbox.FileInfo{Path: name, Size: int64(len(data)), Mode: 0o644})
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Path < out[j].Path })
	return out, nil
}

func (s *fakeSandbox) Info() sandbox.Info { return sandbox.Info{Backend: "fake", ID: "fake"} }

func (s *fakeSandbox) Close(ctx context.Context) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.closed {
		s.closed = true
		s.p.open.Add(-1)
	}
	return nil
}

// fakeProvider counts the sandboxes it started and how many are still open.
type fakeProvider struct {
	started atomic.Int64
	open    atomic.Int64
	// reads, when set, is what Open of a file streams instead of its bytes; ctx is Open's.
	reads func(ctx context.Context, name string, data []byte) io.Reader
	// starts and writes, when set, run at each Start and each input's WriteFrom, with
	// WriteFrom's ctx (a test's panic there, or a hold until the attempt is stopped).
	starts func()
	writes func(ctx context.Context, name string)
	// readFails and listFails, when set, give ReadFile's and List's error (nil: none).
	readFails func(name string) error
	listFails func(dir string) error
}

func (p *fakeProvider) Backend() string { return "fake" }

func (p *fakeProvider) Start(ctx context.Context, spec sandbox.Spec) (sandbox.Sandbox, error) {
	if p.starts != nil {
		p.starts()
	}
	p.started.Add(1)
	p.open.Add(1)
	return &fakeSandbox{p: p, files: map[string][]byte{}}, nil
}

// agentFunc lets each test script the agent.
type agentFunc func(ctx context.Context, req agent.Request) (agent.Result, error)

func (f agentFunc) Run(ctx context.Context, req agent.Request) (agent.Result, error) {
	return f(ctx, req)
}

// writeReport is an agent that writes a report naming the input sizes and succeeds.
func writeReport(ctx context.Context, req agent.Request) (agent.Result, error) {
	var b strings.Builder
	fmt.Fprintf(&b, "# report for %s\n", req.JobID)
	for _, in := range req.Inputs {
		data, err := req.Sandbox.ReadFile(ctx, in, 1<<20)
		if err != nil {
			return agent.Result{}, err
		}
		fmt.Fprintf(&b, "%s: %d bytes\n", in, len(data))
	}
	if err := req.Sandbox.WriteFile(ctx, "report.md", []byte(b.String())); err != nil {
		return agent.Result{}, err
	}
	if err := req.Sandbox.WriteFile(ctx, "artifacts/table.csv", []byte("a,b\n1,2\n")); err != nil {
		return agent.Result{}, err
	}
	return agent.Result{Outcome: agent.OutcomeCompleted, FinalMessage: "done"}, nil
}

type bundle struct {
	t        *testing.T
	srv      *server.Server
	storeDir string
	url      string
	cfg      config.Config
	// shared is the store the runner is given; store is the default tenant's view of it, where
	// its jobs' objects are.
	shared store.Store
	store  store.Store
	q      *queue.Client // the tests submit as tenant default
	nc     *nats.Conn
}

var profiles = `
concurrency: 2
drain_grace: 1s
nats:
  ack_wait: 5s # heartbeats every second: a busy machine stalling the worker for a second or two redelivers nothing
  max_deliver: 3
  retry_backoff: 200ms
profiles:
  p:
    model: {name: m}
    tools: [{name: read_file}]
`

func setup(t *testing.T) *bundle {
	t.Helper()
	b := &bundle{t: t, storeDir: t.TempDir()}
	b.start(-1)
	cfg, err := config.Parse([]byte(profiles))
	if err != nil {
		t.Fatal(err)
	}
	b.cfg = cfg
	b.nc, b.q = b.client()
	st, err := store.NewFile(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	b.shared = st
	b.store = store.ForTenant(st, job.DefaultTenant)
	return b
}

func (b *bundle) start(port int) {
	b.t.Helper()
	srv := queuetest.Start(b.t, queue.EmbeddedOptions{Port: port, StoreDir: b.storeDir, SyncAlways: true})
	b.srv = srv
	b.url = srv.ClientURL()
}

func (b *bundle) connect() (*nats.Conn, *queue.Consumer) {
	b.t.Helper()
	ctx := context.Background()
	nc, err := queue.Connect(ctx, queue.ConnOptions{URL: b.url, Name: "test"})
	if err != nil {
		b.t.Fatal(err)
	}
	b.t.Cleanup(nc.Close)
	q, err := queue.Open(ctx, nc, b.cfg.NATS, b.cfg.Tenants, slog.New(slog.DiscardHandler))
	if err != nil {
		b.t.Fatal(err)
	}
	return nc, q
}

// setAckWait gives the jobs' consumer another ack wait, as `worker setup` with that config
// does: a worker's config alone does not change the consumer's.
func (b *bundle) setAckWait(d time.Duration) {
	b.t.Helper()
	b.cfg.NATS.AckWait = config.Duration(d)
	admin, err := queue.NewAdmin(b.nc, b.cfg.NATS, b.cfg.Tenants, slog.New(slog.DiscardHandler))
	if err != nil {
		b.t.Fatal(err)
	}
	if err := admin.Declare(context.Background()); err != nil {
		b.t.Fatal(err)
	}
}

// consumed tells whether tenant default's consumer has no job left to deliver or to be
// acknowledged.
func (b *bundle) consumed() bool {
	ctx := context.Background()
	js, _ := jetstream.New(b.nc)
	c, err := js.Consumer(ctx, queue.JobStream(b.cfg.NATS, "default"), b.cfg.NATS.Consumer+"-default")
	if err != nil {
		return false
	}
	info, err := c.Info(ctx)
	return err == nil && info.NumPending == 0 && info.NumAckPending == 0
}

// client connects as a submitter of tenant default, after the set-up connect does.
func (b *bundle) client() (*nats.Conn, *queue.Client) {
	b.t.Helper()
	nc, _ := b.connect()
	c, err := queue.NewClient(context.Background(), nc, b.cfg.NATS, "default")
	if err != nil {
		b.t.Fatal(err)
	}
	return nc, c
}

// worker is one runner with its own connection, so a test can kill it.
type worker struct {
	r      *runner.Runner
	m      *metrics.Metrics
	nc     *nats.Conn
	p      *fakeProvider
	cancel context.CancelFunc
	done   chan struct{}
}

func (b *bundle) worker(a runner.Agent, opts ...func(*runner.Config)) *worker {
	b.t.Helper()
	nc, q := b.connect()
	w := &worker{m: metrics.New(), nc: nc, p: &fakeProvider{}, done: make(chan struct{})}
	cfg := runner.Config{Worker: b.cfg, Queue: q, Sandboxes: w.p, Store: b.shared, Agent: a, Metrics: w.m,
		ModelEndpoint: "http://127.0.0.1:1/v1", Logger: slog.New(slog.DiscardHandler), CleanupTimeout: 5 * time.Second}
	for _, o := range opts {
		o(&cfg)
	}
	r, err := runner.New(cfg)
	if err != nil {
		b.t.Fatal(err)
	}
	w.r = r
	ctx, cancel := context.WithCancel(context.Background())
	w.cancel = cancel
	go func() {
		defer close(w.done)
		_ = r.Run(ctx)
	}()
	b.t.Cleanup(w.stop)
	return w
}

func (w *worker) stop() {
	w.cancel()
	<-w.done
}

func (b *bundle) putInput(data []byte) job.Input {
	b.t.Helper()
	return b.putTenantInput(b.store, data)
}

// putTenantInput stores data as an input in st, a tenant's view of the store.
func (b *bundle) putTenantInput(st store.Store, data []byte) job.Input {
	b.t.Helper()
	sum, size, err := provenance.Digest(strings.NewReader(string(data)))
	if err != nil {
		b.t.Fatal(err)
	}
	if err := st.PutIfAbsent(context.Background(), store.InputKey(sum), strings.NewReader(string(data)), size); err != nil && !errors.Is(err, store.ErrExists) {
		b.t.Fatal(err)
	}
	return job.Input{Name: "in.csv", URI: st.URL(store.InputKey(sum)), SHA256: sum, Size: size}
}

func (b *bundle) submit(profile string) job.Job {
	b.t.Helper()
	return b.submitTask(profile, "t")
}

// submitTask submits a job with the given task, which a scripted agent may read.
func (b *bundle) submitTask(profile, task string) job.Job {
	b.t.Helper()
	j := b.newJob(profile, task)
	b.publish(j)
	return j
}

// newJob is a job with its input stored, not yet published. A test whose agent or store hooks
// name the job makes it first: a worker may run a job before Publish has even returned, and a
// variable assigned from submit afterwards would be read by the worker and written by the test
// with nothing ordering the two.
func (b *bundle) newJob(profile, task string) job.Job {
	b.t.Helper()
	return job.Job{Version: job.Version, ID: job.NewID(), Profile: profile, Task: task, SubmittedAt: time.Now().UTC(),
		Inputs: []job.Input{b.putInput([]byte("a,b\n1,2\n"))}}
}

func (b *bundle) publish(j job.Job) {
	b.t.Helper()
	if _, err := b.q.Publish(context.Background(), j); err != nil {
		b.t.Fatal(err)
	}
	time.Sleep(*publishPause)
}

// publishPause holds the test after each publish, as a busy machine may: a worker then runs the
// job before the test goes on, and the race detector sees a test that touches what the worker
// does with nothing ordering the two (`make test` runs the package once with -publish-pause).
var publishPause = flag.Duration("publish-pause", 0, "hold each test this long after it publishes a job")

// killedMidRun submits a job to a new worker whose agent calls run (when not nil) and then
// hangs, and kills that worker once run has returned: its connection closes mid-run, so it can
// neither ack, nak nor record anything more, and the job waits for its redelivery. It returns
// the job and the killed worker.
func (b *bundle) killedMidRun(run func(req agent.Request)) (job.Job, *worker) {
	b.t.Helper()
	started := make(chan struct{}, 1)
	dying := b.worker(agentFunc(func(ctx context.Context, req agent.Request) (agent.Result, error) {
		if run != nil {
			run(req)
		}
		started <- struct{}{}
		<-ctx.Done()
		return agent.Result{}, ctx.Err()
	}))
	j := b.submit("p")
	<-started
	dying.nc.Close()
	dying.stop()
	return j, dying
}

// waitState waits until the job reaches a terminal state and returns its status.
func (b *bundle) waitFinal(id string, within time.Duration) job.Status {
	b.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), within)
	defer cancel()
	updates, err := b.q.WatchStatus(ctx, id)
	if err != nil {
		b.t.Fatal(err)
	}
	var last job.Status
	for st := range updates {
		last = st
	}
	if !last.State.Terminal() {
		b.t.Fatalf("job %s did not end within %s; last status %+v", id, within, last)
	}
	return last
}

// waitFor is harness.Wait for a condition with nothing to report but whether it holds.
func waitFor(t *testing.T, within time.Duration, what string, cond func() bool) {
	t.Helper()
	harness.Wait(t, what, func() (bool, error) { return cond(), nil }, harness.Within(within))
}

// settledLetters is deadLetters once every message of the job stream is settled. A delivery
// writes a job's final status before its dead letter (the status write is its check that it
// still holds the job: docs/lifecycle.md) and terminates the message after the letter, so a
// test that read the letters as soon as the status was final could miss one, and one that
// wants none would pass whatever letter came after.
func (b *bundle) settledLetters() []queue.DeadLetter {
	b.t.Helper()
	waitFor(b.t, time.Minute, "every job message settled, each dead letter written before its term", b.consumed)
	return b.deadLetters()
}

// deadLetters is every dead letter in the shared dead-letter stream and the tenants' own.
func (b *bundle) deadLetters() []queue.DeadLetter {
	b.t.Helper()
	ctx := context.Background()
	js, err := jetstream.New(b.nc)
	if err != nil {
		b.t.Fatal(err)
	}
	var out []queue.DeadLetter
	for _, name := range deadLetterStreams(ctx, js, b.cfg.NATS) {
		s, err := js.Stream(ctx, name)
		if err != nil {
			b.t.Fatal(err)
		}
		info, err := s.Info(ctx)
		if err != nil {
			b.t.Fatal(err)
		}
		for seq := info.State.FirstSeq; seq <= info.State.LastSeq && info.State.Msgs > 0; seq++ {
			m, err := s.GetMsg(ctx, seq)
			if err != nil {
				continue
			}
			var dl queue.DeadLetter
			if err := json.Unmarshal(m.Data, &dl); err != nil {
				b.t.Fatal(err)
			}
			out = append(out, dl)
		}
	}
	return out
}

// deadLetterStreams names the shared dead-letter stream and every tenant's on the server.
func deadLetterStreams(ctx context.Context, js jetstream.JetStream, cfg config.NATS) []string {
	var out []string
	names := js.StreamNames(ctx)
	for name := range names.Name() {
		if name == cfg.DeadLetterStream || strings.HasPrefix(name, cfg.DeadLetterStream+"_") {
			out = append(out, name)
		}
	}
	return out
}

func (b *bundle) manifest(id string) provenance.Statement {
	b.t.Helper()
	rc, err := b.store.Get(context.Background(), store.ManifestKey(id))
	if err != nil {
		b.t.Fatalf("manifest of %s: %v", id, err)
	}
	defer rc.Close()
	data, err := io.ReadAll(rc)
	if err != nil {
		b.t.Fatal(err)
	}
	st, err := provenance.Parse(data)
	if err != nil {
		b.t.Fatal(err)
	}
	return st
}

// signingKeys is a new signing key and its public half.
func signingKeys(t *testing.T) (ed25519.PrivateKey, ed25519.PublicKey) {
	t.Helper()
	privPEM, pubPEM := provenance.GenerateKey()
	priv, err := provenance.LoadPrivateKey(privPEM)
	if err != nil {
		t.Fatal(err)
	}
	pub, err := provenance.LoadPublicKey(pubPEM)
	if err != nil {
		t.Fatal(err)
	}
	return priv, pub
}

// object reads the object under key.
func (b *bundle) object(key string) []byte {
	b.t.Helper()
	rc, err := b.store.Get(context.Background(), key)
	if err != nil {
		b.t.Fatal(err)
	}
	defer rc.Close()
	data, err := io.ReadAll(rc)
	if err != nil {
		b.t.Fatal(err)
	}
	return data
}

// runFile reads the object the committed manifest names name, wherever the run keeps it.
func (b *bundle) runFile(id, name string) []byte {
	b.t.Helper()
	for _, s := range b.manifest(id).Subjects {
		if s.Name != name {
			continue
		}
		return b.object(provenance.SubjectKey(id, s))
	}
	b.t.Fatalf("the manifest of %s names no %s", id, name)
	return nil
}

func TestMain(m *testing.M) {
	// The runner tests spend their time waiting on NATS, the store and ack deadlines, not on
	// the CPU: -parallel's default (GOMAXPROCS, two on a CI machine) would queue them behind
	// each other. An explicit -parallel is kept.
	flag.Parse()
	explicit := false
	flag.Visit(func(f *flag.Flag) { explicit = explicit || f.Name == "test.parallel" })
	if !explicit {
		_ = flag.Set("test.parallel", "8")
	}
	goleak.VerifyTestMain(m, goleak.IgnoreAnyFunction(spawn.StarterFunc))
}
