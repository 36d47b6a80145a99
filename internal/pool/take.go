package pool

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/boxcar-run/boxcar/internal/sandbox"
)

// Take gives the tenant's job a sandbox of its profile: a warm one, claimed for jobID, when the
// pool has one ready or starting, else one started now (warm false), once a slot is free for
// it (makeRoom). Either way the job holds a slot's worth of the pool's room until its sandbox
// is removed, and the pool starts a replacement if its target asks for one.
func (p *Pool) Take(ctx context.Context, tenant, profile, jobID string, spec sandbox.Spec) (sandbox.Sandbox, bool, error) {
	p.mu.Lock()
	now := p.cfg.Now()
	p.inUse++
	p.took(now, tenant, profile, jobID)
	key := takeKey{tenant: tenant, job: jobID, delivery: ctx.Done()}
	begin := p.firstTry(now, key)
	p.mu.Unlock()
	release := sync.OnceFunc(func() {
		p.mu.Lock()
		defer p.mu.Unlock()
		p.inUse--
		p.broadcast()
		// The next job, a few round trips away, should find the sandbox for this slot
		// starting (docs/performance.md, row 16).
		p.refill()
	})
	sb, err := p.takeWarm(ctx, tenant, profile, jobID)
	warm := sb != nil
	if err == nil && !warm {
		sb, err = p.startCold(ctx, profile, spec)
	}
	if err != nil {
		p.mu.Lock()
		p.tries[key] = tries{first: begin, last: p.cfg.Now()}
		p.mu.Unlock()
		release()
		return nil, false, err
	}
	if _, ok := p.profiles[profile]; ok {
		if warm {
			p.m.Hits.WithLabelValues(profile).Inc()
		}
		p.m.Claim.WithLabelValues(profile, fmt.Sprint(warm)).Observe(p.cfg.Now().Sub(begin).Seconds())
	}
	p.poke()
	return &heldSandbox{Sandbox: sb, release: release, p: p}, warm, nil
}

// triesApart is how long after a failed try of a take the next one is still the same take: the
// runner tries again within backoff.Max while the backend is unavailable. One later is a new
// take, timed from its own try.
const triesApart = time.Minute

// takeKey names a take: the tenant's job, and the delivery that takes its sandbox, by its
// context's Done channel. The runner tries a Take again on the context it tried it on (one per
// delivery); a later delivery of the job, come back to this worker after its retry_backoff or
// a lost lease, takes on another, and its wait is its own: keyed by the job alone, it was
// timed from the earlier delivery's first try, the queue's wait between them included.
type takeKey struct {
	tenant, job string
	delivery    <-chan struct{}
}

// tries are the failed tries of a take that is not over: when the first began, the last ended.
type tries struct{ first, last time.Time }

// firstTry is when the take of key began as its job sees it: its first failed try within
// triesApart of this one, else now. boxcar_pool_claim_seconds times the take from then: timed
// from its last try, a job whose sandbox took three tries over a backend's outage claimed it
// in the last one's milliseconds. It forgets the takes whose last try is older, of jobs or
// deliveries that never came back. The caller holds mu.
func (p *Pool) firstTry(now time.Time, key takeKey) time.Time {
	for k, t := range p.tries {
		if now.Sub(t.last) >= triesApart {
			delete(p.tries, k)
		}
	}
	t, ok := p.tries[key]
	if !ok {
		return now
	}
	delete(p.tries, key) // this try's; a failure puts it back
	return t.first
}

// startCold starts the job's own sandbox once a slot is free for it. The miss counts once it
// has one: counted at each try, a job the runner tried again while the backend was unavailable
// was a miss a try, and one cut short waiting for a slot a miss for nothing started.
func (p *Pool) startCold(ctx context.Context, profile string, spec sandbox.Spec) (sandbox.Sandbox, error) {
	if err := p.makeRoom(ctx); err != nil {
		return nil, err
	}
	sb, err := p.cfg.Provider.Start(ctx, spec)
	if _, ok := p.profiles[profile]; ok && err == nil {
		p.m.Misses.WithLabelValues(profile).Inc()
	}
	return sb, err
}

// makeRoom waits until one more sandbox fits in the worker's slots beside those it has or is
// getting (live), letting warm sandboxes go for it: ready ones, newest first, of the profile
// holding most, then starts no Take waits for, called back. It waits for them to be gone, not
// only asked to go: a pod being deleted, a start not yet returned, still runs. Takes waiting
// here go one at a time, in no set order. A closed pool counts its sandboxes until they are
// gone as well: let through at once, a job the draining worker still ran started its sandbox
// beside the warm ones the close was removing, past the worker's slots.
func (p *Pool) makeRoom(ctx context.Context) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.roomWaits++
	defer func() { p.roomWaits-- }()
	for {
		// The Takes waiting here are in inUse; of them, this one alone is to count.
		over := p.live() - p.roomWaits + 1 - p.cfg.Slots
		if over <= 0 {
			return nil
		}
		for n := over - p.going(); n > 0; n-- {
			if !p.trimAny() {
				break // the slots are the taken sandboxes': one comes free when its job ends
			}
		}
		changed := p.changed
		p.mu.Unlock()
		select {
		case <-changed:
		case <-ctx.Done():
		}
		p.mu.Lock()
		if err := ctx.Err(); err != nil {
			return fmt.Errorf("pool: wait for a free slot to start a sandbox: %w", err)
		}
	}
}

// trimAny lets one warm sandbox go (trim) for a cold start: of the profile with most ready,
// else of the first in name order with a start to call back. The caller holds mu.
func (p *Pool) trimAny() bool {
	var most *profilePool
	for _, name := range p.names {
		if pp := p.profiles[name]; len(pp.ready) > 0 && (most == nil || len(pp.ready) > len(most.ready)) {
			most = pp
		}
	}
	if most != nil {
		return p.trim(most, removedColdStart)
	}
	for _, name := range p.names {
		if p.trim(p.profiles[name], removedColdStart) {
			return true
		}
	}
	return false
}

// takeWarm claims the oldest ready sandbox of the profile for tenant's job jobID, waiting for
// one being started when more are starting than Takes already wait for, and never one past
// its max_age (ageOut). It returns nil, nil
// when there is none to have: the caller starts one. A sandbox whose claim fails is removed and the next tried
// (failedClaim).
func (p *Pool) takeWarm(ctx context.Context, tenant, profile, jobID string) (sandbox.Sandbox, error) {
	pp, ok := p.profiles[profile]
	if !ok {
		return nil, nil
	}
	for {
		p.mu.Lock()
		// Past max_age, a sandbox is never handed over, whether a round has aged it out yet
		// or not: a pod's deadline left it Ahead to wait, and no more.
		p.ageOut(pp, p.cfg.Now())
		if len(pp.ready) == 0 && pp.coming() > pp.waiters && !p.closed {
			pp.waiters++
			close(pp.waiting) // a start warming up hands its sandbox over now
			pp.waiting = make(chan struct{})
			changed := p.changed
			p.mu.Unlock()
			var err error
			select {
			case <-changed:
			case <-ctx.Done():
				err = ctx.Err()
			}
			p.mu.Lock()
			pp.waiters--
			p.mu.Unlock()
			if err != nil {
				return nil, fmt.Errorf("pool: wait for a warm sandbox: %w", err)
			}
			continue
		}
		if len(pp.ready) == 0 {
			p.mu.Unlock()
			return nil, nil
		}
		e := pp.ready[0]
		p.setReady(pp, pp.ready[1:])
		p.mu.Unlock()
		err := claim(ctx, e.sb, tenant, jobID)
		p.mu.Lock()
		switch {
		case err == nil:
			pp.unclaimed, pp.claimRetryAt = 0, time.Time{}
		case ctx.Err() != nil:
			p.destroy(pp, e.sb, removedClaimCut)
		default:
			p.failedClaim(pp, e.sb, tenant, jobID, err)
		}
		p.mu.Unlock()
		if err == nil {
			return e.sb, nil
		}
		if ctx.Err() != nil {
			return nil, fmt.Errorf("pool: claim: %w", err)
		}
	}
}

func claim(ctx context.Context, sb sandbox.Sandbox, tenant, jobID string) error {
	if c, ok := sandbox.As[sandbox.Claimer](sb); ok {
		return c.Claim(ctx, tenant, jobID)
	}
	return nil
}

// heldSandbox is a taken sandbox that gives its room back to the pool once removed. It has
// Sandbox's methods alone: the runner finds the backend's optional ones (Egress, UsageCounter)
// through Unwrap, with sandbox.As.
type heldSandbox struct {
	sandbox.Sandbox
	release func()
	p       *Pool
	retry   sync.Once
}

// Close removes the sandbox; once it is gone, its room is the pool's again. One whose removal
// failed keeps its room (it may still run) and is removed again in the background (remove).
func (h *heldSandbox) Close(ctx context.Context) error {
	err := h.Sandbox.Close(ctx)
	if err == nil {
		h.release()
		return nil
	}
	h.retry.Do(func() {
		h.p.mu.Lock()
		defer h.p.mu.Unlock()
		h.p.remove(h.Sandbox, 1, h.release)
	})
	return err
}

// Unwrap returns the backend's sandbox.
func (h *heldSandbox) Unwrap() sandbox.Sandbox { return h.Sandbox }
