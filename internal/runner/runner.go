// Package runner owns one worker's slots and the flow of one job end to end: fetch, validate,
// sandbox, inputs, agent loop, outputs, upload with the manifest last, cleanup, ack. It decides
// what a job's outcome means for the queue; the parts it drives decide nothing about each other.
package runner

import (
	"context"
	"crypto/ed25519"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/boxcar-run/boxcar/internal/agent"
	"github.com/boxcar-run/boxcar/internal/config"
	"github.com/boxcar-run/boxcar/internal/egress"
	"github.com/boxcar-run/boxcar/internal/job"
	"github.com/boxcar-run/boxcar/internal/metrics"
	"github.com/boxcar-run/boxcar/internal/provenance"
	"github.com/boxcar-run/boxcar/internal/queue"
	"github.com/boxcar-run/boxcar/internal/sandbox"
	"github.com/boxcar-run/boxcar/internal/store"
)

// Queue is what the runner needs from the job queue.
type Queue interface {
	Fetch(ctx context.Context) (*queue.Delivery, error)
	Status(ctx context.Context, r queue.Ref) (job.Status, error)
	// UpdateStatus changes a job's status unless it ended or fails one of conds (an attempt's
	// writes are queue.ByAttempt: see writeStatus).
	UpdateStatus(ctx context.Context, r queue.Ref, change func(*job.Status), conds ...queue.StatusCond) (job.Status, error)
	// UpdateNewStatus is UpdateStatus with a first try that creates the status: for a first
	// delivery's claim, whose job has none yet.
	UpdateNewStatus(ctx context.Context, r queue.Ref, change func(*job.Status), conds ...queue.StatusCond) (job.Status, error)
	// WatchCancels watches one tenant's cancel requests, WatchAllCancels every tenant's on one
	// watch (cancelWatch); Tenants are the worker's.
	WatchCancels(ctx context.Context, tenant string) (<-chan queue.CancelUpdate, error)
	WatchAllCancels(ctx context.Context) (<-chan queue.CancelUpdate, error)
	Tenants() []string
	// CancelAsked reports whether the cancel bucket holds a request for the job, and
	// ReleaseCancel lets one expire: see claim and releaseCancel.
	CancelAsked(ctx context.Context, r queue.Ref) (bool, error)
	ReleaseCancel(ctx context.Context, r queue.Ref) error
	// Queued reports whether the job stream holds a message of the job (cancelWatch.apply).
	Queued(ctx context.Context, r queue.Ref) (bool, error)
	// LiveProfiles are the profiles the live workers define (queue.ProfilesBucket): a job this
	// worker's config cannot take may be another's (peers.go).
	LiveProfiles(ctx context.Context) ([]queue.WorkerProfiles, error)
}

// Agent runs the model loop of one job. It writes the transcript to req.Transcript, which
// the runner uploads; Result.Transcript is not read.
type Agent interface {
	Run(ctx context.Context, req agent.Request) (agent.Result, error)
}

// Pool gives a tenant's job its sandbox, one started ahead when the profile keeps warm ones
// (internal/pool), else one started for it; warm says which.
type Pool interface {
	Take(ctx context.Context, tenant, profile, jobID string, spec sandbox.Spec) (sb sandbox.Sandbox, warm bool, err error)
}

// Config wires a runner. Every field without a default is required.
type Config struct {
	// Worker is the validated worker configuration with its profiles.
	Worker config.Config
	Queue  Queue
	// Sandboxes starts the sandbox of each job; the backend comes from host configuration only.
	Sandboxes sandbox.Provider
	// Pool, when set, gives each job its sandbox instead of Sandboxes.Start: a warm one when
	// the profile's pool has one. Optional.
	Pool    Pool
	Store   store.Store
	Agent   Agent
	Metrics *metrics.Metrics
	// Approvals carries the shell tool's "ask" approvals to a person and back (the queue
	// implements it). Optional: without it every command that needs approval is refused.
	Approvals Approvals
	// ModelGate, when set, holds the fetch loop while the model endpoint is down (modelwait.go).
	ModelGate ModelGate
	// ModelEndpoint is the base URL of the model API, recorded (host only) in manifests.
	ModelEndpoint string
	// ApproverKeys are the keys whose signed answers to approval requests the runner trusts
	// (internal/approvalsig); an answer signed by none of them is refused, so with no keys every
	// "ask" command is refused once answered.
	ApproverKeys provenance.Keyring
	// Usage keeps each tenant's model tokens per UTC day, checked against its daily_tokens
	// before each model request (usage.go). Optional: without it no budget is enforced.
	Usage Usage
	// TenantStores are the stores of the tenants with a bucket of their own (tenants.T.bucket
	// in the worker config), by tenant; every other tenant's objects are in Store. Either way
	// under store.TenantPrefix(T) (store.ForTenant): the runner wraps them.
	TenantStores map[string]store.Store
	// SigningKey signs manifests when set.
	SigningKey ed25519.PrivateKey
	// Logger defaults to slog.Default().
	Logger *slog.Logger
	// CleanupTimeout bounds closing a sandbox and the final queue and status calls, which run
	// even after shutdown has begun. Default: 30s.
	CleanupTimeout time.Duration
	// HeartbeatInterval is how often a running job tells the queue it is alive. Default: a
	// third of the consumer's AckWait.
	HeartbeatInterval time.Duration
	// Egress is the worker-level setting of each networked job's proxy (its Metrics made once
	// per worker); OnDecision and Logger are the runner's to set.
	Egress egress.Config
	// LookupEnv reads the worker's environment for profile secrets "from: env:NAME"
	// (os.LookupEnv). Default: none set.
	LookupEnv func(string) (string, bool)
	// Now is the worker's wall clock, which may be out of step with the NATS servers' (see
	// job.ClockSkew). Default: time.Now.
	Now func() time.Time
	// TempDir is where each running job's transcript is spooled (unlinked: nothing stays
	// there). Default: os.TempDir().
	TempDir string
	// heartbeat tells the queue the delivery is worked on until ctx ends
	// ((*queue.Delivery).Heartbeat; a test's panic there: export_test.go).
	heartbeat func(d *queue.Delivery, ctx context.Context, interval time.Duration)
}

// Causes of a job's context ending early.
var (
	errShutdown  = errors.New("worker shutting down")
	errCancelled = errors.New("cancelled by request")
)

// Runner runs jobs from the queue, at most Worker.Concurrency at once.
type Runner struct {
	cfg     Config
	log     *slog.Logger
	m       *metrics.Metrics
	cancels *cancelWatch
	// waiters holds the fetch loop while attempts wait for a dependency, one per row of
	// fetchHolds.
	waiters [len(fetchHolds)]waiters
	// rootAdopted: AdoptRootLayout is done, so Run need not do it.
	rootAdopted atomic.Bool
	profiles    manifestProfiles

	mu       sync.Mutex
	draining bool
	running  map[string]int // job id → attempts of it running here
}

// New checks the wiring and fills defaults.
func New(cfg Config) (*Runner, error) {
	switch {
	case cfg.Queue == nil, cfg.Sandboxes == nil, cfg.Store == nil, cfg.Agent == nil:
		return nil, errors.New("runner: Queue, Sandboxes, Store and Agent are required")
	case cfg.Worker.Concurrency < 1:
		return nil, errors.New("runner: Worker.Concurrency must be at least 1")
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Metrics == nil {
		cfg.Metrics = metrics.New()
	}
	if cfg.CleanupTimeout <= 0 {
		cfg.CleanupTimeout = 30 * time.Second
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.heartbeat == nil {
		cfg.heartbeat = (*queue.Delivery).Heartbeat
	}
	// A transcript moves to a file only once it is large, in the middle of a run: a folder
	// that cannot take one is found now instead.
	f, err := createUnlinked(cfg.TempDir)
	if err != nil {
		return nil, fmt.Errorf("runner: the transcripts' temporary folder: %w", err)
	}
	f.Close()
	cancels := newCancelWatch(cfg.Queue, cfg.Logger)
	cancels.approvals = cfg.Approvals
	return &Runner{cfg: cfg, log: cfg.Logger, m: cfg.Metrics, cancels: cancels, running: map[string]int{}}, nil
}

// Draining reports whether the runner has stopped taking jobs.
func (r *Runner) Draining() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.draining
}

// Holds reports whether a job is running on this runner now; the sandbox reaper spares its
// sandbox.
func (r *Runner) Holds(jobID string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.running[jobID] > 0
}

func (r *Runner) hold(jobID string, delta int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.running[jobID] += delta
	if r.running[jobID] <= 0 {
		delete(r.running, jobID)
	}
}

// Run fetches and runs jobs until ctx ends. Then it stops fetching and lets running jobs finish
// within Worker.DrainGrace; jobs still running after that are interrupted and handed back to
// the queue at once, so another worker can take them. Before its first fetch it moves what
// workers before tenants left at the store's root into tenant default's folder
// (AdoptRootLayout), unless that was done, and fails if it cannot.
func (r *Runner) Run(ctx context.Context) error {
	slots := r.cfg.Worker.Concurrency
	free := make(chan struct{}, slots)
	for range slots {
		free <- struct{}{}
	}
	r.m.SlotsFree.Set(float64(slots))
	if err := r.AdoptRootLayout(ctx); err != nil {
		if ctx.Err() != nil {
			return nil // stopped before it began
		}
		return err
	}

	// Cancels are watched from before the first fetch until the last job ended. A job
	// cancelled while it waited in the queue is recorded so before it starts: by the watch, or,
	// while its tenant's watch is behind, by its attempt, which looks up its own
	// (cancelWatch.before).
	watchCtx, stopWatch := context.WithCancel(context.WithoutCancel(ctx))
	watched := r.cancels.start(watchCtx)
	defer func() { stopWatch(); <-watched }()

	// Jobs run on their own context so that a shutdown signal lets them finish their work
	// within the grace period instead of cutting them off mid-upload.
	jobCtx, stopJobs := context.WithCancelCause(context.WithoutCancel(ctx))
	defer stopJobs(nil)
	deliveries, done := r.startSlots(jobCtx, slots, free)
	for ctx.Err() == nil {
		select {
		case <-ctx.Done():
			continue
		case <-free:
		}
		r.awaitModel(ctx)
		r.awaitHolds(ctx)
		d, err := r.cfg.Queue.Fetch(ctx)
		if err != nil {
			free <- struct{}{}
			if ctx.Err() == nil {
				r.log.ErrorContext(ctx, "fetch failed", "error", err)
			}
			continue
		}
		r.m.SlotsFree.Dec()
		r.m.JobsInFlight.Inc()
		deliveries <- d
	}
	close(deliveries)
	r.drain(done, stopJobs)
	return nil
}

// startSlots starts n slots, each running the jobs handed to it on one goroutine and settling
// them on another: a job's deep calls (JSON, TLS) grow a goroutine's stack, which a goroutine
// per job would grow again each time. A job hands its settling over before its slot is free
// again (free), so no more jobs settle at once than there are slots, and a NATS that does not
// answer holds the worker back. done is closed once deliveries is closed and every job handed
// over has settled.
func (r *Runner) startSlots(ctx context.Context, n int, free chan<- struct{}) (deliveries chan<- *queue.Delivery, done <-chan struct{}) {
	jobs, settles, finished := make(chan *queue.Delivery), make(chan func()), make(chan struct{})
	var running, settling sync.WaitGroup
	for range n {
		running.Go(func() {
			for d := range jobs {
				settles <- r.work(ctx, d)
				r.m.JobsInFlight.Dec()
				r.m.SlotsFree.Inc()
				free <- struct{}{}
			}
		})
		settling.Go(func() {
			for settle := range settles {
				settle()
			}
		})
	}
	go func() {
		running.Wait()
		close(settles)
		settling.Wait()
		close(finished)
	}()
	return jobs, finished
}

// drain waits for the running jobs within Worker.DrainGrace, then interrupts those left.
func (r *Runner) drain(done <-chan struct{}, stopJobs context.CancelCauseFunc) {
	r.mu.Lock()
	r.draining = true
	r.mu.Unlock()
	grace := time.Duration(r.cfg.Worker.DrainGrace)
	r.log.Info("draining", "grace", grace.String())
	select {
	case <-done:
	case <-time.After(grace):
		r.log.Warn("drain grace passed; interrupting running jobs")
		stopJobs(errShutdown)
		<-done
	}
}
