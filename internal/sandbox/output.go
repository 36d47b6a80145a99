package sandbox

// cappedBuffer keeps the first max bytes written to it and counts the rest as truncated. It
// never fails a write: a command that prints without end must not block on a full pipe, so
// the excess is read and dropped.
type cappedBuffer struct {
	max       int
	buf       []byte
	truncated bool
}

func (c *cappedBuffer) Write(p []byte) (int, error) {
	n := min(max(c.max-len(c.buf), 0), len(p))
	c.buf = append(c.buf, p[:n]...)
	if n < len(p) {
		c.truncated = true
	}
	return len(p), nil
}
