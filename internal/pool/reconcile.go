package pool

import (
	"context"
	"slices"
	"time"

	"github.com/boxcar-run/boxcar/internal/backoff"
	"github.com/boxcar-run/boxcar/internal/sandbox"
)

// Reconcile brings every profile's pool to its target once: it reads the lag, drops aged
// sandboxes, shares the free slots out and starts or removes sandboxes to match. Starts run in
// the background; a sandbox counts towards its pool from the moment its start begins.
func (p *Pool) Reconcile(ctx context.Context) {
	lags, err := p.cfg.Lag.Lags(ctx)
	if err != nil && ctx.Err() == nil {
		p.log.Warn("pool: read the queue's lag; keeping the pool as it is", "error", err)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if err == nil {
		p.lags = lags
	}
	p.resizeAll()
}

// resizeAll drops aged sandboxes, shares the free slots out and starts or removes sandboxes to
// match the targets on the lag read last: every pool over its share first, then those under it,
// each into slots free now. A slot share counts as free may still hold a sandbox being
// removed, which runs until it is gone: grown into at once, a pool the demand moved to ran
// beside the one it moved from, 4 sandboxes on a worker of 2 slots; it grows once the
// removal's end calls this again. The caller holds mu.
func (p *Pool) resizeAll() {
	if p.closed {
		return
	}
	now := p.cfg.Now()
	wants := make(map[string]int, len(p.names))
	for _, name := range p.names {
		pp := p.profiles[name]
		p.ageOut(pp, now)
		wants[name] = p.want(pp, now)
	}
	alloc := p.share(wants)
	for _, name := range p.names {
		p.shrink(p.profiles[name], alloc[name], removedOverTarget)
	}
	for _, name := range p.names {
		pp := p.profiles[name]
		p.grow(pp, alloc[name])
	}
}

// ageOut removes the warm sandboxes nobody claimed within max_age of their start's beginning,
// from which the backend counts their wait too (spec.Ahead: a pod's deadline, a bubblewrap
// sandbox's expiry); the pool replaces them, once they are gone, if it still wants them.
func (p *Pool) ageOut(pp *profilePool, now time.Time) {
	maxAge := pp.warm.MaxAge.Std()
	keep := pp.ready[:0]
	for _, e := range pp.ready {
		if now.Sub(e.born) >= maxAge {
			p.destroy(pp, e.sb, removedAged)
			continue
		}
		keep = append(keep, e)
	}
	p.setReady(pp, keep)
}

// want is the profile's target before the worker's slots are shared out: its part of the
// pending jobs (Lag, mix.go) within min and max, and no lower than its present size until the lag has stayed
// below that size for the idle time.
func (p *Pool) want(pp *profilePool, now time.Time) int {
	hi := pp.warm.Max
	if hi == 0 {
		hi = p.cfg.Slots
	}
	demand := p.part(now, pp.name)
	want := int(min(demand, uint64(hi)))
	want = max(want, pp.warm.Min)
	size := pp.size()
	if want >= size {
		pp.lastBusy = now
		return want
	}
	if now.Sub(pp.lastBusy) < pp.warm.Idle.Std() {
		return size
	}
	return want
}

// share splits the worker's free slots between the profiles: first every profile's minimum,
// then the rest one at a time in name order, so that no pool starves another for long. A slot
// is free once what held it is gone: a sandbox being removed, or a start called back, still
// holds its own.
func (p *Pool) share(wants map[string]int) map[string]int {
	room := p.cfg.Slots - p.inUse - p.going()
	alloc := make(map[string]int, len(wants))
	for _, name := range p.names {
		n := min(wants[name], p.profiles[name].warm.Min, max(room, 0))
		alloc[name], room = n, room-n
	}
	for room > 0 {
		gave := false
		for _, name := range p.names {
			if room > 0 && alloc[name] < wants[name] {
				alloc[name]++
				room--
				gave = true
			}
		}
		if !gave {
			break
		}
	}
	return alloc
}

// shrink removes sandboxes of a pool over its share n, counting those coming: ready ones,
// newest first, then starts called back, newest first.
func (p *Pool) shrink(pp *profilePool, n int, why removal) {
	for over := pp.size() - n; over > 0; over-- {
		if !p.trim(pp, why) {
			break
		}
	}
}

// grow starts sandboxes of a pool under its share n, counting those coming, as long as the
// worker has a slot free of every sandbox (live). A profile whose starts or claims failed
// starts none until its backoff has passed (failedStart, failedClaim).
func (p *Pool) grow(pp *profilePool, n int) {
	if now := p.cfg.Now(); now.Before(pp.retryAt) || now.Before(pp.claimRetryAt) {
		return
	}
	for size := pp.size(); size < n && p.live() < p.cfg.Slots; size++ {
		p.start(pp)
	}
}

// trim lets one of the profile's warm sandboxes go for why: the newest ready one, else the
// newest start no Take waits for, whose sandbox, if it comes all the same, goes for why. It
// reports whether there was one. The caller holds mu.
func (p *Pool) trim(pp *profilePool, why removal) bool {
	if last := len(pp.ready) - 1; last >= 0 {
		p.destroy(pp, pp.ready[last].sb, why)
		p.setReady(pp, pp.ready[:last])
		return true
	}
	if pp.coming() <= pp.waiters {
		return false
	}
	for i := len(pp.starts) - 1; i >= 0; i-- {
		if ws := pp.starts[i]; !ws.cancelled {
			ws.cancelled, ws.why = true, why
			ws.cancel()
			return true
		}
	}
	return false
}

// start begins one warm sandbox of the profile in the background. The caller holds mu.
func (p *Pool) start(pp *profilePool) {
	ctx, cancel := context.WithCancel(p.ctx)
	ws := &warmStart{cancel: cancel}
	pp.starts = append(pp.starts, ws)
	born := p.cfg.Now()
	spec := sandbox.Spec{Pool: pp.name, Ahead: pp.warm.MaxAge.Std(), SandboxSpec: pp.spec}
	p.inFlight++
	go func() {
		defer cancel()
		sb, err := p.cfg.Provider.Start(ctx, spec)
		if err == nil {
			p.warmUp(ctx, pp, sb)
		}
		p.mu.Lock()
		defer p.mu.Unlock()
		pp.starts = slices.DeleteFunc(pp.starts, func(s *warmStart) bool { return s == ws })
		p.inFlight--
		p.broadcast()
		switch {
		case err != nil && (ws.cancelled || ctx.Err() != nil): // called back, or the pool stops: nothing went wrong
		case err != nil:
			p.m.Replaced.WithLabelValues(pp.name, string(removedStartFailed)).Inc()
			p.failedStart(pp, err)
		case ws.cancelled:
			p.destroy(pp, sb, ws.why)
		case p.closed:
			p.destroy(pp, sb, removedClosed)
		default:
			p.setReady(pp, append(pp.ready, entry{sb: sb, born: born}))
		}
		if err == nil {
			pp.failed, pp.retryAt = 0, time.Time{}
		} else if p.ctx.Err() == nil {
			p.refill()
		}
	}()
}

// refill shares out at once a slot that came free, a job's, a removed sandbox's, or a start's
// that ended without one, on the lag read last, without reading it again; Run's next round,
// which the poke wakes, corrects the pools on a fresh lag. Left to that round, a pool the
// demand moved to stayed empty while the start called back for it had already ended. A failed
// start's slot stays in its profile's share (share counts its want, backoff or not): the
// profile fills it once its backoff has passed, and no other profile starts a sandbox there
// that the retry would remove again (TestFailedStartKeepsItsSlot). The caller holds mu.
func (p *Pool) refill() {
	p.resizeAll()
	p.poke()
}

// failedStart holds the profile's starts back (internal/backoff, up to 5 s) after one failed:
// tried again at every round, a failure that lasts (an image that cannot be pulled, a Root
// that cannot be written) had the pool start each missing sandbox twice a second and at every
// take and return, each a pod created and deleted and a warning logged. The caller holds mu.
func (p *Pool) failedStart(pp *profilePool, err error) {
	pp.failed++
	delay := backoff.Delay(pp.failed)
	pp.retryAt = p.cfg.Now().Add(delay)
	p.log.Warn("pool: start a warm sandbox; trying again after a pause", "profile", pp.name, "error", err,
		"failures_in_a_row", pp.failed, "retry_in", delay.String())
}

// failedClaim removes a warm sandbox whose claim failed, and holds the profile's starts back
// as failedStart does: a claim that fails for every sandbox (a pod the worker may not patch)
// had each removal's end start another at once, which the take waited for, claimed and
// removed in turn until its job's context ended, a pod created and deleted each time, rather
// than start the job's own (TestFailingClaimsBackOff). The caller holds mu.
func (p *Pool) failedClaim(pp *profilePool, sb sandbox.Sandbox, tenant, jobID string, err error) {
	p.destroy(pp, sb, removedClaimFailed)
	pp.unclaimed++
	delay := backoff.Delay(pp.unclaimed)
	pp.claimRetryAt = p.cfg.Now().Add(delay)
	p.log.Warn("pool: a warm sandbox could not be claimed; removing it, and starting none for a pause", "profile", pp.name,
		"job_id", jobID, "tenant", tenant, "error", err, "failures_in_a_row", pp.unclaimed, "retry_in", delay.String())
}

// warmUp lets a started sandbox do ahead what its first command would (sandbox.Warmer), and
// waits for that before the sandbox counts as ready, unless a job is about to take it: a Take
// waits for a start, or the queue held more jobs of the profile (its part, mix.go) waiting to
// be delivered than the pool has ready sandboxes at its last lag read (a burst: the worker
// fetches the next job as soon as a slot is free). Then the sandbox is handed over as it is,
// since the job would otherwise wait for the warm-up (which, for bubblewrap, costs more than
// the first command's own start) or, coming first, have it thrown away half done: CPU the
// running jobs needed (row 16).
func (p *Pool) warmUp(ctx context.Context, pp *profilePool, sb sandbox.Sandbox) {
	w, ok := sandbox.As[sandbox.Warmer](sb)
	if !ok {
		return
	}
	p.mu.Lock()
	wanted := pp.waiters > len(pp.ready) || p.part(p.cfg.Now(), pp.name) > uint64(len(pp.ready))
	waiting := pp.waiting
	p.mu.Unlock()
	if wanted {
		return
	}
	select {
	case <-w.Warm():
	case <-waiting:
	case <-ctx.Done():
	case <-p.stop: // Close waits for this start, and then removes the sandbox
	}
}

// broadcast wakes the Takes waiting for a start or a free slot. The caller holds mu.
func (p *Pool) broadcast() {
	close(p.changed)
	p.changed = make(chan struct{})
}
