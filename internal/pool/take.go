package pool

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/boxcar-run/boxcar/internal/backoff"
	"github.com/boxcar-run/boxcar/internal/sandbox"
)

// Take gives the tenant's job a sandbox of its profile: a warm one, claimed for jobID, when the
// pool has one ready or starting, else one started now (warm false). Either way the job holds a
// slot's worth of the pool's room until it closes the sandbox, and the pool starts a
// replacement if its target asks for one.
func (p *Pool) Take(ctx context.Context, tenant, profile, jobID string, spec sandbox.Spec) (sandbox.Sandbox, bool, error) {
	begin := time.Now()
	p.mu.Lock()
	p.inUse++
	p.took(p.cfg.Now(), tenant, profile)
	p.mu.Unlock()
	release := sync.OnceFunc(func() {
		p.mu.Lock()
		p.inUse--
		// On the lag read last, without reading it again: the next job, a few round trips
		// away, should find the sandbox for this slot starting (docs/performance.md, row 16).
		// Run's next round, which the poke wakes, corrects the pools on a fresh lag.
		p.resizeAll()
		p.mu.Unlock()
		p.poke()
	})
	sb, err := p.takeWarm(ctx, profile, jobID)
	warm := sb != nil
	if err == nil && !warm {
		if _, ok := p.profiles[profile]; ok {
			p.m.Misses.WithLabelValues(profile).Inc()
		}
		sb, err = p.cfg.Provider.Start(ctx, spec)
	}
	if err != nil {
		release()
		return nil, false, err
	}
	if _, ok := p.profiles[profile]; ok {
		if warm {
			p.m.Hits.WithLabelValues(profile).Inc()
		}
		p.m.Claim.WithLabelValues(profile, fmt.Sprint(warm)).Observe(time.Since(begin).Seconds())
	}
	p.poke()
	return &heldSandbox{Sandbox: sb, release: release, p: p}, warm, nil
}

// takeWarm claims the oldest ready sandbox of the profile, waiting for one being started
// when more are starting than Takes already wait for. It returns nil, nil when there is none
// to have: the caller starts one. A sandbox whose claim fails is removed and the next tried.
func (p *Pool) takeWarm(ctx context.Context, profile, jobID string) (sandbox.Sandbox, error) {
	pp, ok := p.profiles[profile]
	if !ok {
		return nil, nil
	}
	for {
		p.mu.Lock()
		if len(pp.ready) == 0 && pp.starting > pp.waiters && !p.closed {
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
		pp.ready = pp.ready[1:]
		p.m.Size.WithLabelValues(profile).Set(float64(len(pp.ready)))
		p.mu.Unlock()
		if err := claim(ctx, e.sb, jobID); err != nil {
			if ctx.Err() != nil {
				p.destroy(e.sb)
				return nil, fmt.Errorf("pool: claim: %w", err)
			}
			p.m.Replaced.WithLabelValues(profile, "claim_failed").Inc()
			p.log.Warn("pool: a warm sandbox could not be claimed; removing it", "profile", profile, "job_id", jobID, "error", err)
			p.destroy(e.sb)
			continue
		}
		return e.sb, nil
	}
}

func claim(ctx context.Context, sb sandbox.Sandbox, jobID string) error {
	if c, ok := sandbox.As[sandbox.Claimer](sb); ok {
		return c.Claim(ctx, jobID)
	}
	return nil
}

// heldSandbox is a taken sandbox that gives its room back to the pool when closed. It has
// Sandbox's methods alone: the runner finds the backend's optional ones (Egress, UsageCounter)
// through Unwrap, with sandbox.As.
type heldSandbox struct {
	sandbox.Sandbox
	release func()
	p       *Pool
}

// Close removes the sandbox; once it is gone, its room is the pool's again. One whose removal
// failed keeps its room (it may still run) and is removed again in the background.
func (h *heldSandbox) Close(ctx context.Context) error {
	err := h.Sandbox.Close(ctx)
	if err == nil {
		h.release()
	} else {
		h.p.removeLater(h.Sandbox, h.release)
	}
	return err
}

// removeLater tries again, in the background, to remove a taken sandbox its job could not
// (a Kubernetes API that did not answer, a cgroup still busy: Close may be called again), and
// gives its room back once it is gone. Kept taken for good, every close that failed once would
// leave the pool a warm sandbox fewer for the rest of the worker's life. It stops when the pool
// closes: what is left then is the restart's clean-up's (the reaper, bubblewrap's leftovers).
func (p *Pool) removeLater(sb sandbox.Sandbox, release func()) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return
	}
	p.work.Add(1)
	go func() {
		defer p.work.Done()
		for round := 1; ; round++ {
			select {
			case <-p.stop:
				return
			case <-time.After(backoff.Delay(round)):
			}
			ctx, cancel := context.WithTimeout(context.Background(), p.cfg.CloseTimeout)
			err := sb.Close(ctx)
			cancel()
			if err == nil {
				p.log.Info("pool: removed a taken sandbox whose close had failed; its room is free again", "sandbox_id", sb.Info().ID, "tries", round+1)
				release()
				return
			}
			if round == 1 {
				p.log.Warn("pool: a taken sandbox could not be removed; trying again until it is", "sandbox_id", sb.Info().ID, "error", err)
			}
		}
	}()
}

// Unwrap returns the backend's sandbox.
func (h *heldSandbox) Unwrap() sandbox.Sandbox { return h.Sandbox }
