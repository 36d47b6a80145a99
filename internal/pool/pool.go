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

	"github.com/boxcar-run/boxcar/internal/backoff"
	"github.com/boxcar-run/boxcar/internal/config"
	"github.com/boxcar-run/boxcar/internal/queue"
	"github.com/boxcar-run/boxcar/internal/sandbox"
)

// Lag is one tenant's demand for warm sandboxes as the queue shows it: its jobs waiting to be
// delivered. Its jobs in flight are none: the queue counts them across the fleet, and each
// already has its sandbox on the worker that fetched it, or takes one there a few round trips
// after the fetch. This worker's own fetched ones were pending at a read before their fetch,
// and the pool keeps what it started for them for the idle time (want); counted in flight, a
// worker whose slots were idle while others ran jobs kept warm sandboxes no job would take,
// up to its free slots, and never drained to its minimum while the fleet was busy.
type Lag struct {
	Tenant  string
	Pending uint64
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
		out = append(out, Lag{Tenant: l.Tenant, Pending: l.Startable()})
	}
	return out, nil
}

// Config wires a Pool.
type Config struct {
	// Provider starts and names the sandboxes. Required.
	Provider sandbox.Provider
	// Profiles are the worker's; those with Warm set get a pool. Required.
	Profiles map[string]config.Profile
	// Slots is the worker's concurrency: warm and taken sandboxes together, with those being
	// started or removed, never exceed it. Required.
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
	// CloseTimeout bounds each try at removing a sandbox the pool drops. Default: 30s.
	CloseTimeout time.Duration
}

// Pool keeps the warm sandboxes of every warm profile of one worker.
//
// Every sandbox it has or is getting counts against Config.Slots (live): those taken (and
// Takes under way), the warm ones ready or starting, and those being removed, which may still
// run. The pool starts warm ones only into free slots (share), and a cold start for a Take
// waits for a free slot, removing ready warm sandboxes and calling back warm starts for it
// (makeRoom).
type Pool struct {
	cfg      Config
	log      *slog.Logger
	m        *Metrics
	profiles map[string]*profilePool
	names    []string // warm profiles, sorted: the order slots are shared out in
	kick     chan struct{}

	mu        sync.Mutex
	inUse     int                // sandboxes taken (or being taken) and not removed yet
	removing  int                // sandboxes the pool let go and is removing (remove)
	inFlight  int                // starts and removals under way: Close waits for them (settle)
	roomWaits int                // Takes waiting for a free slot to start one cold (makeRoom)
	lags      []Lag              // the lag read last
	mixes     map[string]*mix    // by tenant: how its recent takes split between its profiles
	tries     map[takeKey]tries  // the failed tries of takes not over (firstTry)
	changed   chan struct{}      // closed and replaced whenever a start ends or a slot frees
	ctx       context.Context    // the starts': cancelled by Close, whether Run runs or not
	cancel    context.CancelFunc // ends ctx
	closed    bool
	stop      chan struct{} // closed by Close: a start ends its warm-up wait, a removal its retries
}

// profilePool is one profile's warm sandboxes.
type profilePool struct {
	name     string
	warm     config.Warm
	spec     config.SandboxSpec
	ready    []entry       // oldest first
	starts   []*warmStart  // in flight, oldest first; those called back among them
	waiters  int           // Takes waiting for a start in flight
	waiting  chan struct{} // closed and replaced whenever a Take begins to wait for a start
	lastBusy time.Time
	failed   int       // starts that failed in a row (a start that succeeds ends the row)
	retryAt  time.Time // no start before it: the backoff of the failed row
	// Claims that failed in a row (a claim that succeeds ends the row), and no start before
	// claimRetryAt: a start that succeeds says nothing of whether its sandbox can be claimed.
	unclaimed    int
	claimRetryAt time.Time
}

// warmStart is one warm sandbox being started. Calling it back cancels its start; a sandbox
// that comes all the same is removed.
type warmStart struct {
	cancel    context.CancelFunc
	cancelled bool
	why       removal // why it was called back
}

// coming is how many of the profile's starts in flight will make a ready sandbox: those not
// called back.
func (pp *profilePool) coming() int {
	n := 0
	for _, ws := range pp.starts {
		if !ws.cancelled {
			n++
		}
	}
	return n
}

// size is the profile's pool as its target counts it: ready, and coming but not awaited by a
// Take.
func (pp *profilePool) size() int { return len(pp.ready) + pp.coming() - pp.waiters }

type entry struct {
	sb   sandbox.Sandbox
	born time.Time // when its start began: the backend counts its wait for a claim from then
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
	p := &Pool{cfg: cfg, log: cfg.Logger, m: cfg.Metrics, profiles: map[string]*profilePool{}, mixes: map[string]*mix{}, tries: map[takeKey]tries{},
		kick: make(chan struct{}, 1), changed: make(chan struct{}), stop: make(chan struct{})}
	p.ctx, p.cancel = context.WithCancel(context.Background())
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

// Run keeps the pools at their targets until ctx ends, then closes the pool (Close): the starts
// in flight are cut short and every warm sandbox removed. Sandboxes already taken are their
// jobs' to close.
func (p *Pool) Run(ctx context.Context) error {
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
// A start still in flight (the backend's Start, or a warm-up: sandbox.Warmer) is cut short (its
// context ends, whether Run began it or a Take or Reconcile before Run ran) and waited for, and
// a sandbox it brings all the same removed; no start begins after Close has begun. Until then, a job the draining worker still runs may take a ready one;
// every sandbox the pool has, ready, starting or being removed, still counts against Slots
// for the others (makeRoom) until it is gone or its removal is given up (remove).
func (p *Pool) Close() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.closed {
		p.closed = true
		close(p.stop)
		p.cancel()
	}
	p.settle()
	for _, pp := range p.profiles {
		for _, e := range pp.ready {
			p.destroy(pp, e.sb, removedClosed)
		}
		p.setReady(pp, nil)
	}
	p.settle()
}

// settle waits until no start or removal is under way, those that begin while it waits
// included: a job's sandbox whose close fails begins its removal whenever it does, a close of
// the pool under way or not. Counted under mu rather than on a sync.WaitGroup, whose Add from
// zero must not run while a Wait may (Go may panic: "WaitGroup is reused before previous Wait
// has returned"). The caller holds mu.
func (p *Pool) settle() {
	for p.inFlight > 0 {
		changed := p.changed
		p.mu.Unlock()
		<-changed
		p.mu.Lock()
	}
}

// ended counts a start or a removal as ended (inFlight) and wakes settle.
func (p *Pool) ended() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.inFlight--
	p.broadcast()
}

// setReady is the one way the profile's ready sandboxes change: boxcar_pool_size follows them
// at once, whichever path took one away or added one. Set by each path for itself, a take
// that aged the last one out left the gauge at 1 until the next round. The caller holds mu.
func (p *Pool) setReady(pp *profilePool, ready []entry) {
	pp.ready = ready
	p.m.Size.WithLabelValues(pp.name).Set(float64(len(ready)))
}

func (p *Pool) poke() {
	select {
	case p.kick <- struct{}{}:
	default:
	}
}

// live is how many sandboxes the worker has or is getting (Pool). A Take waiting for a start
// counts once: the start it waits for is its sandbox. The caller holds mu.
func (p *Pool) live() int {
	n := p.inUse + p.removing
	for _, pp := range p.profiles {
		n += len(pp.ready) + len(pp.starts) - pp.waiters
	}
	return n
}

// going is how many of the live sandboxes are on their way out: being removed, or starts
// called back. The caller holds mu.
func (p *Pool) going() int {
	n := p.removing
	for _, pp := range p.profiles {
		n += len(pp.starts) - pp.coming()
	}
	return n
}

// destroy removes a warm sandbox of pp the pool drops, counting it under why
// (boxcar_pool_removed_total). Its slot stays counted until it is gone, and is then refilled at
// once on the lag read last, as a slot a job gives back is. The caller holds mu.
func (p *Pool) destroy(pp *profilePool, sb sandbox.Sandbox, why removal) {
	p.m.Replaced.WithLabelValues(pp.name, string(why)).Inc()
	p.removing++
	p.remove(sb, 0, func() {
		p.mu.Lock()
		defer p.mu.Unlock()
		p.removing--
		p.broadcast()
		p.refill()
	})
}

// remove is the one way a sandbox leaves the pool's hands, warm or taken: in the background,
// it closes sb, and while that fails closes it again, backing off (internal/backoff), until it
// is gone; then gone runs. failed is how many closes failed already (a job's own). Kept for
// good, every close that failed once would hold a slot, or a warm sandbox no job would take,
// for the rest of the worker's life, and nothing else removes it while the worker runs:
// bubblewrap's leftovers are swept at the next start, and the Kubernetes reaper keeps the pods
// its provider still has open. The retries stop when the pool closes: what is left then is the
// restart's clean-up's, and gone runs all the same, so that no Take of the draining worker
// waits for a slot such a sandbox holds. The caller holds mu.
func (p *Pool) remove(sb sandbox.Sandbox, failed int, gone func()) {
	p.inFlight++
	go func() {
		defer p.ended()
		for round := failed; ; round++ {
			if round > 0 {
				select {
				case <-p.stop:
					p.log.Warn("pool: the worker stops; a sandbox whose removal failed is left to the clean-up at its next start", "sandbox_id", sb.Info().ID)
					gone()
					return
				case <-time.After(backoff.Delay(round)):
				}
			}
			ctx, cancel := context.WithTimeout(context.Background(), p.cfg.CloseTimeout)
			err := sb.Close(ctx)
			cancel()
			if err == nil {
				if round > 0 {
					p.log.Info("pool: removed a sandbox whose removal had failed", "sandbox_id", sb.Info().ID, "tries", round+1)
				}
				gone()
				return
			}
			if round == failed {
				p.log.Warn("pool: a sandbox could not be removed; trying again until it is", "sandbox_id", sb.Info().ID, "error", err)
			}
		}
	}()
}
