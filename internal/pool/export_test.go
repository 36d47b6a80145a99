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
