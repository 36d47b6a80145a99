// Package pool owns the warm sandboxes of a worker: per profile, sandboxes started ahead of
// their jobs, each taken by exactly one job and then removed, never reused. It sizes each
// profile's pool from the queue's lag, each tenant's towards the profiles granted to it, within
// the profile's min and max and the worker's free slots. It does not decide what a job may do
// in its sandbox, nor bind the job's network, inputs or environment: the runner does that after
// Take, alike for warm and cold sandboxes.
package pool

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"time"

	"github.com/boxcar-run/boxcar/internal/config"
	"github.com/boxcar-run/boxcar/internal/queue"
	"github.com/boxcar-run/boxcar/internal/sandbox"
)

// Lag is one tenant's demand as the queue shows it: its jobs waiting to be delivered and its
// jobs delivered but not yet acknowledged.
type Lag struct {
	Tenant            string
	Pending, InFlight uint64
}

// LagSource reports the queue's lag, tenant by tenant. The jobs stream's subjects name the
// tenant but not the profile, so the pool counts each tenant's lag towards the profiles granted
// to it, split between them as its recent jobs were (mix.go).
type LagSource interface {
	Lags(ctx context.Context) ([]Lag, error)
}

// QueueLag is a LagSource over the workers' consumers (queue.Consumer.ConsumerLag). A tenant's
// pending jobs count only as many as its max_concurrent lets start (queue.Lag.Startable): the
// pool warms no sandbox for a job that must wait for another of its tenant's to end.
type QueueLag func(ctx context.Context) ([]queue.Lag, error)

// Lags reads every tenant's consumer.
func (f QueueLag) Lags(ctx context.Context) ([]Lag, error) {
	lags, err := f(ctx)
	if err != nil {
		return nil, err
	}
	out := make([]Lag, 0, len(lags))
	for _, l := range lags {
		out = append(out, Lag{Tenant: l.Tenant, Pending: l.Startable(), InFlight: l.AckPending})
	}
	return out, nil
}

// Config wires a Pool.
type Config struct {
	// Provider starts and names the sandboxes. Required.
	Provider sandbox.Provider
	// Profiles are the worker's; those with Warm set get a pool. Required.
	Profiles map[string]config.Profile
	// Slots is the worker's concurrency: warm and taken sandboxes together never exceed it.
	// Required.
	Slots int
	// Lag is the queue's demand. Required when a profile is warm.
	Lag LagSource
	// Tenants are the worker's (config.TenantsOrDefault): a tenant's lag counts towards the
	// warm profiles granted to it, and a tenant not among them towards none. Nil: every
	// tenant's counts towards every profile.
	Tenants map[string]config.Tenant
	// Metrics records pool size, hits, misses and claim latency. Default: unregistered.
	Metrics *Metrics
	// Logger defaults to slog.Default().
	Logger *slog.Logger
	// Interval is how often Run looks at the lag. Default: 500ms.
	Interval time.Duration
	// Now is the clock (tests set a fake one). Default: time.Now.
	Now func() time.Time
	// CloseTimeout bounds removing a sandbox the pool drops. Default: 30s.
	CloseTimeout time.Duration
}

// Pool keeps the warm sandboxes of every warm profile of one worker.
type Pool struct {
	cfg      Config
	log      *slog.Logger
	m        *Metrics
	profiles map[string]*profilePool
	names    []string // warm profiles, sorted: the order slots are shared out in
	kick     chan struct{}
	work     sync.WaitGroup // starts and closes in flight

	mu      sync.Mutex
	inUse   int             // sandboxes taken (or being taken) and not closed yet
	lags    []Lag           // the lag read last
	mixes   map[string]*mix // by tenant: how its recent takes split between its profiles
	changed chan struct{}   // closed and replaced whenever a start ends
	ctx     context.Context
	closed  bool
	stop    chan struct{} // closed by Close: a start ends its warm-up wait
}

// profilePool is one profile's warm sandboxes.
type profilePool struct {
	name     string
	warm     config.Warm
	spec     config.SandboxSpec
	ready    []entry // oldest first
	starting int
	waiters  int           // Takes waiting for a start in flight
	waiting  chan struct{} // closed and replaced whenever a Take begins to wait for a start
	lastBusy time.Time
}

type entry struct {
	sb   sandbox.Sandbox
	born time.Time
}

// New checks the wiring and fills defaults.
func New(cfg Config) (*Pool, error) {
	if cfg.Provider == nil || cfg.Slots < 1 {
		return nil, errors.New("pool: Provider and a Slots of at least 1 are required")
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Metrics == nil {
		cfg.Metrics = NewMetrics(nil)
	}
	if cfg.Interval <= 0 {
		cfg.Interval = 500 * time.Millisecond
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.CloseTimeout <= 0 {
		cfg.CloseTimeout = 30 * time.Second
	}
	p := &Pool{cfg: cfg, log: cfg.Logger, m: cfg.Metrics, profiles: map[string]*profilePool{}, mixes: map[string]*mix{},
		kick: make(chan struct{}, 1), changed: make(chan struct{}), ctx: context.Background(), stop: make(chan struct{})}
	for name, prof := range cfg.Profiles {
		if prof.Warm == nil {
			continue
		}
		if cfg.Lag == nil {
			return nil, fmt.Errorf("pool: profile %s is warm, but no Lag source is set", name)
		}
		p.profiles[name] = &profilePool{name: name, warm: *prof.Warm, spec: prof.Sandbox, lastBusy: cfg.Now(), waiting: make(chan struct{})}
		p.names = append(p.names, name)
		p.m.Size.WithLabelValues(name).Set(0)
	}
	slices.Sort(p.names)
	return p, nil
}

// Backend names the provider's backend.
func (p *Pool) Backend() string { return p.cfg.Provider.Backend() }

// Run keeps the pools at their targets until ctx ends, then removes every warm sandbox and
// waits for the starts in flight. Sandboxes already taken are their jobs' to close.
func (p *Pool) Run(ctx context.Context) error {
	p.mu.Lock()
	p.ctx = ctx
	p.mu.Unlock()
	t := time.NewTicker(p.cfg.Interval)
	defer t.Stop()
	for {
		p.Reconcile(ctx)
		select {
		case <-ctx.Done():
			p.Close()
			return nil
		case <-t.C:
		case <-p.kick:
		}
	}
}

// Close stops the pool: it removes every warm sandbox once the starts in flight have ended.
// Run calls it when its ctx ends. Sandboxes already taken are their jobs' to close.
//
// A start still in flight (the backend's Start, or a warm-up: sandbox.Warmer) is waited for,
// without waiting for its warm-up to end, and its sandbox removed; no start begins after
// Close has begun.
func (p *Pool) Close() {
	p.mu.Lock()
	if !p.closed {
		p.closed = true
		close(p.stop)
	}
	p.mu.Unlock()
	p.work.Wait()
	p.mu.Lock()
	var drop []entry
	for _, pp := range p.profiles {
		drop = append(drop, pp.ready...)
		pp.ready = nil
		p.m.Size.WithLabelValues(pp.name).Set(0)
	}
	p.mu.Unlock()
	for _, e := range drop {
		p.destroy(e.sb)
	}
	p.work.Wait()
}

func (p *Pool) poke() {
	select {
	case p.kick <- struct{}{}:
	default:
	}
}

// destroy removes a sandbox the pool drops, in the background, on a context of its own.
func (p *Pool) destroy(sb sandbox.Sandbox) {
	p.work.Add(1)
	go func() {
		defer p.work.Done()
		ctx, cancel := context.WithTimeout(context.Background(), p.cfg.CloseTimeout)
		defer cancel()
		if err := sb.Close(ctx); err != nil {
			p.log.Warn("remove a warm sandbox", "sandbox_id", sb.Info().ID, "error", err)
		}
	}()
}
