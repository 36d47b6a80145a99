package pool

// Settle waits until the starts and removals in flight have ended.
func (p *Pool) Settle() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.settle()
}

// Waiters is how many Takes of the profile wait for a start in flight.
func (p *Pool) Waiters(profile string) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.profiles[profile].waiters
}

// Starting is how many of the profile's starts are in flight.
func (p *Pool) Starting(profile string) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.profiles[profile].starts)
}

// Closed reports whether Close has begun.
func (p *Pool) Closed() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.closed
}

// RoomWaits is how many Takes wait for a free slot.
func (p *Pool) RoomWaits() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.roomWaits
}

// MixJobs is how many of the tenant's jobs its mix remembers as counted.
func (p *Pool) MixJobs(tenant string) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	if m := p.mixes[tenant]; m != nil {
		return len(m.counted)
	}
	return 0
}

// RemovalReasons are boxcar_pool_removed_total's reasons.
func RemovalReasons() []string {
	out := make([]string, 0, len(removals))
	for _, r := range removals {
		out = append(out, string(r.reason))
	}
	return out
}
