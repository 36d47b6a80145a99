package sandbox

import "sync"

// cappedBuffer keeps the first max bytes written to it and counts the rest as truncated. It
// never fails a write: a command that prints without end must not block on a full pipe, so
// the excess is read and dropped.
//
// Writers may outlive the call that reads the result: client-go's pods/exec client returns as
// soon as its ctx ends, while its copying goroutines still write. So writes are locked, and
// take seals the buffer: what it returned does not change afterwards.
type cappedBuffer struct {
	mu        sync.Mutex
	max       int
	buf       []byte
	truncated bool
	sealed    bool
}

func (c *cappedBuffer) Write(p []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.sealed {
		return len(p), nil
	}
	n := min(max(c.max-len(c.buf), 0), len(p))
	c.buf = append(c.buf, p[:n]...)
	if n < len(p) {
		c.truncated = true
	}
	return len(p), nil
}

// take returns what was kept and whether anything was dropped, and drops all later writes.
func (c *cappedBuffer) take() ([]byte, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.sealed = true
	return c.buf, c.truncated
}
