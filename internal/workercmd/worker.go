package workercmd

import (
	"context"
	"crypto/ed25519"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"golang.org/x/sync/errgroup"

	"github.com/boxcar-run/boxcar/internal/agent"
	"github.com/boxcar-run/boxcar/internal/config"
	"github.com/boxcar-run/boxcar/internal/connflags"
	"github.com/boxcar-run/boxcar/internal/egress"
	"github.com/boxcar-run/boxcar/internal/metrics"
	"github.com/boxcar-run/boxcar/internal/modelgate"
	"github.com/boxcar-run/boxcar/internal/pool"
	"github.com/boxcar-run/boxcar/internal/provenance"
	"github.com/boxcar-run/boxcar/internal/queue"
	"github.com/boxcar-run/boxcar/internal/redact"
	"github.com/boxcar-run/boxcar/internal/runner"
	"github.com/boxcar-run/boxcar/internal/sandbox"
	"github.com/boxcar-run/boxcar/internal/store"
)

// Worker is a started worker. Ready closes once it takes jobs; Stop begins its drain; Wait
// returns once it has stopped. Readiness is this value, not a log line to look for.
type Worker struct {
	ready chan struct{}
	done  chan struct{}
	stop  context.CancelFunc
	err   error // set before done closes

	mu    sync.Mutex
	addrs Addrs
}

// Addrs are where a started worker can be reached. They are complete once Ready has closed;
// --ready-file holds them as JSON.
type Addrs struct {
	// NATS is the URL the worker uses: with --embedded, its own server's (--nats-listen port 0
	// picks a free port).
	NATS string `json:"nats"`
	// Metrics is the host:port of /metrics, /healthz and /readyz; empty when off. It is set
	// as soon as the endpoint listens, before Ready: /readyz says why a worker is not ready.
	Metrics string `json:"metrics,omitempty"`
	// Store is the store's URL.
	Store string `json:"store"`
}

// Ready closes once the worker takes jobs: NATS and the store answer, the runner runs and the
// metrics endpoint listens. It never closes for a worker that stops first (see Done).
func (w *Worker) Ready() <-chan struct{} { return w.ready }

// Done closes once the worker has stopped, ready or not; Wait then returns at once.
func (w *Worker) Done() <-chan struct{} { return w.done }

// Addrs are the worker's addresses: complete once Ready has closed (Metrics before).
func (w *Worker) Addrs() Addrs {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.addrs
}

// Stop begins the drain, as SIGTERM does: no new jobs, running ones finish within drain_grace.
// It does not wait: Wait does.
func (w *Worker) Stop() { w.stop() }

// Wait blocks until the worker has stopped and returns why: nil after Stop or the end of the
// context Start was given, else the error that stopped it.
func (w *Worker) Wait() error {
	<-w.done
	return w.err
}

// parts are what a worker is made of, opened by Start before anything waits.
type parts struct {
	cfg       config.Config
	log       *slog.Logger
	nats      *server.Server // the embedded NATS server; nil unless --embedded
	unlock    func()         // releases the embedded worker's data dir; nil unless --embedded
	natsOpts  queue.ConnOptions
	link      *queue.Link
	store     store.Store
	tenants   map[string]store.Store // the stores of tenants with a bucket of their own
	sandboxes sandbox.Provider
	agent     *agent.Agent
	metrics   *metrics.Metrics
	poolM     *pool.Metrics   // nil: the pool's own, registered nowhere
	egressM   *egress.Metrics // every networked job's proxy's
	modelURL  string
	gate      *modelgate.Gate // the model endpoint's circuit breaker
	signer    ed25519.PrivateKey
	egress    egress.Config               // each networked job's proxy, worker-level
	lookupEnv func(string) (string, bool) // profile secrets "from: env:NAME"
	approvers provenance.Keyring
	pool      *pool.Pool // warm sandboxes; nil when no profile keeps any
}

// close releases what Start opened, the last opened first.
func (p *parts) close() {
	if p.link != nil {
		p.link.Close()
	}
	for _, st := range p.tenants {
		_ = st.Close()
	}
	if p.store != nil {
		_ = p.store.Close()
	}
	if p.nats != nil {
		p.nats.Shutdown()
	}
	if p.unlock != nil {
		p.unlock()
	}
}

// Start checks the settings and opens the worker's parts, failing at once on anything no wait
// can fix (a bad config, flag or profile, an unusable sandbox backend, an unreadable key), then
// runs the worker until ctx ends or Stop is called: it waits for NATS and the store as long as
// they take, saying why on /readyz, and closes Ready once it takes jobs.
func Start(ctx context.Context, o Options) (*Worker, error) {
	o, err := o.withDefaults()
	if err != nil {
		return nil, err
	}
	var level slog.Level
	if err := level.UnmarshalText([]byte(o.LogLevel)); err != nil {
		return nil, fmt.Errorf("--log-level: %w", err)
	}
	if o.MetricsAddr != "" {
		if err := config.CheckMetricsAddr(o.MetricsAddr); err != nil {
			return nil, fmt.Errorf("--metrics-addr: %w", err)
		}
	}
	log := slog.New(slog.NewJSONHandler(o.Stderr, &slog.HandlerOptions{Level: level}))
	// Libraries that write to the standard logger (net/http's Transport behind each job's
	// proxy) may quote a bound host's answer in it, secret and all: egress.CaptureStdLog.
	egress.CaptureStdLog(log)
	p, err := open(ctx, o, log)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(ctx)
	w := &Worker{ready: make(chan struct{}), done: make(chan struct{}), stop: cancel}
	go func() {
		defer close(w.done)
		defer cancel()
		defer p.close()
		w.err = w.run(ctx, o, p)
	}()
	return w, nil
}

// open reads the config and opens the parts; what can be checked without NATS or the store
// comes first, so a bad setting stops the worker at once, not after a wait.
func open(ctx context.Context, o Options, log *slog.Logger) (_ *parts, err error) {
	cfg, src, err := loadConfig(o)
	if err != nil {
		return nil, err
	}
	env, err := readStartEnv(&cfg, o.conn, o.Embedded, o.Getenv)
	if err != nil {
		return nil, err
	}
	c := NewCollectors()
	p := &parts{log: log, metrics: c.Worker, poolM: c.Pool, egressM: c.Egress, natsOpts: env.nats, modelURL: env.modelURL}
	defer func() {
		if err != nil {
			p.close()
		}
	}()
	if o.Embedded {
		if err := startEmbedded(o, &cfg, p); err != nil {
			return nil, err
		}
	}
	if o.MetricsAddr != "" {
		cfg.MetricsAddr = o.MetricsAddr
	}
	p.cfg = cfg
	if p.sandboxes, err = newProvider(cfg, log); err != nil {
		return nil, err
	}
	if err := p.openModel(o, env.modelTransport, src); err != nil {
		return nil, err
	}
	if p.signer, err = signingKey(o, cfg, log); err != nil {
		return nil, err
	}
	p.lookupEnv = func(k string) (string, bool) { v := o.Getenv(k); return v, v != "" }
	if p.egress, err = egressConfig(cfg, p.modelURL, p.egressM); err != nil {
		return nil, err
	}
	if networked(cfg) {
		egress.WarnUnlistedNAT64(ctx, p.egress, log)
	}
	if p.approvers, err = approverKeys(o, cfg, log); err != nil {
		return nil, err
	}
	if err := p.openStores(ctx, o, cfg, env.s3Transport); err != nil {
		return nil, err
	}
	if p.link, err = queue.Dial(p.natsOpts, log); err != nil {
		return nil, err
	}
	return p, nil
}

// openStores opens the shared store and the buckets of the tenants that have their own, over
// s3Transport (nil: the SDK's own client).
func (p *parts) openStores(ctx context.Context, o Options, cfg config.Config, s3Transport *http.Transport) error {
	var s3Client *http.Client
	if s3Transport != nil {
		s3Client = &http.Client{Transport: s3Transport}
	}
	storeOpts := store.Options{Endpoint: cfg.Store.Endpoint, Region: cfg.Store.Region, HTTPClient: s3Client,
		PathStyle: cfg.Store.PathStyle, AllowUnsafeOverwrite: cfg.Store.AllowUnsafeOverwrite,
		ProbeInterval: time.Duration(cfg.Store.ProbeInterval), Logger: p.log, Getenv: o.Getenv}
	var err error
	if p.store, err = store.Open(ctx, cfg.Store.URL, storeOpts); err != nil {
		return err
	}
	p.tenants, err = openTenantStores(ctx, cfg, storeOpts)
	return err
}

// openModel opens the model's side of p: the gate that watches it and the agent that calls it
// (p.modelURL, over modelTransport, nil: the default), whose profiles are compiled now, so a
// bad profile stops the worker here (placed in the config file src).
func (p *parts) openModel(o Options, modelTransport *http.Transport, src *config.Source) error {
	if modelTransport == nil {
		modelTransport = http.DefaultTransport.(*http.Transport).Clone()
	}
	connflags.WarnPlaintextKey(p.log, p.modelURL, o.Getenv("OPENAI_API_KEY"))
	var err error
	if p.gate, err = newModelGate(p.modelURL, o.Getenv("OPENAI_API_KEY"), modelTransport.Clone(), p.metrics, p.log); err != nil {
		return err
	}
	p.agent, err = agent.New(agent.Config{
		BaseURL:        p.modelURL,
		APIKey:         o.Getenv("OPENAI_API_KEY"),
		HTTPClient:     &http.Client{Transport: p.metrics.ModelTransport(modelTransport)},
		RequestTimeout: p.cfg.Model.RequestTimeout.Std(),
		MaxRetries:     p.cfg.Model.MaxRetries,
		Gate:           p.gate,
		Logger:         p.log,
		Profiles:       p.cfg.Profiles,
	})
	if err != nil {
		return src.Place(err)
	}
	return nil
}

// startEmbedded locks the data dir, starts NATS in-process with its token, and points cfg and
// the connection options at it and cfg at the file store under the data dir. The sandbox stays
// the config's (bubblewrap by default): one machine can still run its jobs in pods of a
// cluster it reaches.
func startEmbedded(o Options, cfg *config.Config, p *parts) error {
	if o.DataDir == "" {
		return errors.New("no --data-dir, no BOXCAR_HOME and no HOME: give --data-dir")
	}
	if err := os.MkdirAll(o.DataDir, 0o700); err != nil {
		return fmt.Errorf("create data dir: %w", err)
	}
	host, port, err := splitListen(o.NATSListen)
	if err != nil {
		return err
	}
	if p.unlock, err = lockDataDir(o.DataDir); err != nil {
		return err
	}
	tok, err := embeddedToken(o.DataDir, host, p.natsOpts)
	if err != nil {
		return err
	}
	if p.nats, err = queue.StartEmbedded(queue.EmbeddedOptions{Host: host, Port: port, StoreDir: filepath.Join(o.DataDir, "nats"), Token: tok}); err != nil {
		return err
	}
	cfg.NATS.URL = p.nats.ClientURL()
	p.natsOpts.URL, p.natsOpts.Token = cfg.NATS.URL, tok
	cfg.Store = config.Store{URL: "file://" + filepath.Join(o.DataDir, "store")}
	p.log.Info("embedded NATS listening", "url", cfg.NATS.URL, "data_dir", o.DataDir,
		"token_file", filepath.Join(o.DataDir, connflags.EmbeddedTokenFile))
	return nil
}

// run serves the endpoints, waits for NATS and the store, then runs jobs until ctx ends.
func (w *Worker) run(ctx context.Context, o Options, p *parts) error {
	cfg, log := p.cfg, p.log
	g, gctx := errgroup.WithContext(ctx)
	// The endpoints come up before the worker waits for anything, so /readyz says what it
	// waits for. They outlive the drain: /healthz keeps the kubelet from killing a draining
	// worker, /readyz says it is draining, and /metrics shows the last jobs finish.
	serveCtx, stopServing := context.WithCancel(context.WithoutCancel(gctx))
	defer stopServing()
	boot := &starting{link: p.link}
	metricsAddr := make(chan string, 1)
	if cfg.MetricsAddr != "off" {
		g.Go(func() error {
			return p.metrics.Serve(serveCtx, cfg.MetricsAddr, boot.ready, log, func(a net.Addr) {
				log.Info("metrics listening", "addr", a.String())
				w.mu.Lock()
				w.addrs.Metrics = a.String()
				w.mu.Unlock()
				metricsAddr <- a.String()
			})
		})
	} else {
		metricsAddr <- ""
	}
	r, q, err := startRunner(gctx, p, boot)
	if err != nil {
		stopServing()
		if serr := g.Wait(); serr != nil {
			return serr
		}
		if ctx.Err() != nil {
			log.Info("worker stopped before it was ready")
			return nil
		}
		return err
	}
	p.metrics.WatchQueue(serveCtx, queueLag(q))
	boot.set(nil, readiness(r, p.link, q, p.store, p.sandboxes, p.gate))
	g.Go(func() error {
		defer stopServing()
		return r.Run(gctx)
	})
	if p.pool != nil {
		g.Go(func() error { return p.pool.Run(gctx) })
	}
	// For `submit profiles` and run's check of a profile before it uploads anything.
	g.Go(func() error { return q.AdvertiseProfiles(gctx, cfg.WorkerID, cfg.Profiles, cfg.TenantsOrDefault()) })
	if kp, ok := p.sandboxes.(*sandbox.KubernetesProvider); ok {
		g.Go(func() error { return kp.RunReaper(gctx, time.Minute, heldBy(gctx, cfg.WorkerID, r, q)) })
	}
	select {
	case addr := <-metricsAddr:
		w.announce(o, p, addr)
	case <-gctx.Done(): // the endpoint failed, or the worker stops before it listened
	}
	err = g.Wait()
	if o.ReadyFile != "" {
		_ = os.Remove(o.ReadyFile) // a stopped worker is not ready
	}
	log.Info("worker stopped")
	return err
}

// startRunner waits until NATS and the store answer, then builds the runner. A NATS or store
// that does not answer yet is waited for, not a reason to exit: a rollout that restarts NATS
// must not turn into crash loops.
func startRunner(ctx context.Context, p *parts, boot *starting) (*runner.Runner, *queue.Consumer, error) {
	q, err := awaitQueue(ctx, p.log, boot, p.cfg.NATS, p.cfg.Tenants)
	if err == nil {
		err = awaitStore(ctx, p.log, boot, p.store)
	}
	var usage *queue.Usage
	if err == nil {
		usage, err = queue.OpenUsage(ctx, p.link.Conn(), q.Tenants(), true)
	}
	if err != nil {
		return nil, nil, err
	}
	if p.pool, err = newPool(p, pool.QueueLag(q.ConsumerLag)); err != nil {
		return nil, nil, err
	}
	var warm runner.Pool
	if p.pool != nil {
		warm = p.pool
	}
	r, err := runner.New(runner.Config{
		Pool:          warm,
		Worker:        p.cfg,
		Queue:         q,
		Approvals:     q,
		Sandboxes:     p.sandboxes,
		Store:         p.store,
		TenantStores:  p.tenants,
		Usage:         usage,
		Agent:         p.agent,
		Metrics:       p.metrics,
		ModelEndpoint: p.modelURL,
		ModelGate:     p.gate,
		SigningKey:    p.signer,
		ApproverKeys:  p.approvers,
		Logger:        p.log,
		Egress:        p.egress,
		LookupEnv:     p.lookupEnv,
	})
	if err == nil {
		err = awaitRootLayout(ctx, p.log, boot, r)
	}
	return r, q, err
}

// heldBy tells the pod reaper whether a live worker holds a pod's job: sandbox pods whose job no
// live worker holds (their worker crashed or was replaced, the job ended or moved on) are
// removed at start and then every minute. This worker knows its own jobs (the runner). Another worker's job
// is judged by its status, which this worker can read only in the tenants it serves
// (q.Tenants()): workers of one deployment serve different tenants during a rolling upgrade
// that adds or removes one, and a job of a tenant this worker does not serve would look
// unknown, so gone. When in doubt, it is spared: a pod of a tenant this worker does not
// serve; a pod that names no tenant (one an older worker started, or claimed from its pool)
// whose job is in none of this worker's tenants; any status that cannot be read. Such a pod is
// its own worker's to reap, or a worker's that serves its tenant, and its deadline ends it in
// any case.
func heldBy(ctx context.Context, self string, r *runner.Runner, q *queue.Consumer) func(sandbox.PodJob) bool {
	return func(j sandbox.PodJob) bool {
		switch {
		case j.Worker == self:
			return r.Holds(j.JobID)
		case j.JobID == "": // another worker's warm pod: kept while that worker lives
			return workerLive(ctx, q, j.Worker)
		case j.Tenant != "" && !slices.Contains(q.Tenants(), j.Tenant):
			return true
		case j.Tenant != "":
			held, _ := heldIn(ctx, q, j.Tenant, j)
			return held
		}
		for _, tenant := range q.Tenants() {
			if held, found := heldIn(ctx, q, tenant, j); found {
				return held
			}
		}
		return true
	}
}

// heldIn reads j's job in tenant: found says the tenant has it (or its status could not be
// read: then it counts as held), held that it runs on j's worker.
func heldIn(ctx context.Context, q *queue.Consumer, tenant string, j sandbox.PodJob) (held, found bool) {
	st, err := q.Status(ctx, queue.Ref{Tenant: tenant, ID: j.JobID})
	switch {
	case errors.Is(err, queue.ErrUnknownJob):
		return false, false
	case err != nil:
		return true, true // when in doubt, spare it
	}
	return !st.State.Terminal() && st.Worker == j.Worker, true
}

// workerLive reports whether worker publishes its profiles (every live worker does); when in
// doubt, it says yes.
func workerLive(ctx context.Context, q *queue.Consumer, worker string) bool {
	live, err := q.LiveProfiles(ctx)
	if err != nil {
		return !errors.Is(err, queue.ErrNoProfiles)
	}
	return slices.ContainsFunc(live, func(w queue.WorkerProfiles) bool { return w.Worker == worker })
}

// announce records the addresses, says the worker is ready (the log, the line on stdout, the
// ready file) and closes Ready.
func (w *Worker) announce(o Options, p *parts, metricsAddr string) {
	cfg := p.cfg
	addrs := Addrs{NATS: queue.RedactURL(cfg.NATS.URL), Metrics: metricsAddr, Store: p.store.URL("")}
	w.mu.Lock()
	w.addrs = addrs
	w.mu.Unlock()
	p.log.Info("worker ready", "worker_id", cfg.WorkerID, "concurrency", cfg.Concurrency, "sandbox", p.sandboxes.Backend(),
		"store", addrs.Store, "nats", addrs.NATS, "nats_auth", p.natsOpts.Auth(), "model", redact.URL(p.modelURL), "profiles", len(cfg.Profiles))
	fmt.Fprintf(o.Stdout, "worker ready: nats %s, store %s\n", addrs.NATS, addrs.Store)
	if o.ReadyFile != "" {
		if err := writeReadyFile(o.ReadyFile, addrs); err != nil {
			p.log.Error("could not write the ready file; a parent process waiting on it will not see the worker ready", "path", o.ReadyFile, "error", err)
		}
	}
	close(w.ready)
}

// queueLag is the consumer's per-tenant lag as the metrics take it.
func queueLag(q *queue.Consumer) metrics.QueueLag {
	return func(ctx context.Context) ([]metrics.TenantLag, error) {
		lags, err := q.ConsumerLag(ctx)
		out := make([]metrics.TenantLag, len(lags))
		for i, l := range lags {
			out[i] = metrics.TenantLag{Tenant: l.Tenant, Pending: l.Pending, AckPending: l.AckPending, ConfigMismatch: l.ConfigMismatch}
		}
		return out, err
	}
}
