package sandbox

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
)

// cappedReader reads r up to max bytes and fails with ErrTooLarge when r holds a byte more: a
// file may grow after its size was checked, and must not push a read past the caller's cap.
type cappedReader struct {
	r        io.Reader
	left     int64 // bytes still allowed
	op, name string
	max      int64
}

func (c *cappedReader) Read(p []byte) (int, error) {
	if int64(len(p)) > c.left {
		// One byte past the cap shows a file that grew.
		p = p[:c.left+1]
	}
	n, err := c.r.Read(p)
	if int64(n) > c.left {
		n = int(c.left)
		c.left = 0
		return n, fmt.Errorf("sandbox: %s %s: more than the %d bytes allowed: %w", c.op, c.name, c.max, ErrTooLarge)
	}
	c.left -= int64(n)
	return n, err
}

// streamReader is what Open returns on every backend: reads go through r until the reader is
// closed, ctx (Open's) ends, or the sandbox shuts down (stop); Close ends the call the reader
// holds on the sandbox, so that the sandbox's Close, which waits for calls in flight, is not
// kept waiting by a reader nobody reads any more.
type streamReader struct {
	r    io.Reader
	ctx  context.Context // ended by Open's ctx, the sandbox's shutdown or Close
	name string
	// release stops the stream and frees what it holds; it runs once, on Close.
	release func()
	once    sync.Once
}

func (s *streamReader) Read(p []byte) (int, error) {
	n, err := s.r.Read(p)
	if err != nil && !errors.Is(err, io.EOF) && !errors.Is(err, ErrTooLarge) && s.ctx.Err() != nil {
		// The stream failed because it was stopped: say why, not how.
		return n, fmt.Errorf("sandbox: open %s: %w", s.name, context.Cause(s.ctx))
	}
	return n, err
}

func (s *streamReader) Close() error {
	s.once.Do(s.release)
	return nil
}
