package pool

// Settle waits until the starts and removals in flight have ended.
func (p *Pool) Settle() { p.work.Wait() }
