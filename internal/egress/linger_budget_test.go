package egress

import (
	"bufio"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"
)

// TestLingerIsBoundedByTheByteCap: a sandbox that sends refused requests with long bodies, and
// keeps sending them once answered, has the worker read and drop no more than the job's
// max_bytes in all: each linger read up to 16 MiB whatever the cap, so the worker read
// 16 MiB for every request the job had (about 160 GiB at the defaults).
func TestLingerIsBoundedByTheByteCap(t *testing.T) {
	const (
		limit = 2 << 20
		conns = 6
		body  = 16 << 20
		slack = 1 << 20 // a connection's socket buffers: written, never read by the proxy
	)
	h := setup(t, func(c *Config) { c.Limits.MaxBytes = limit })
	var total int64
	for i := range conns {
		c := h.dialProxy(t)
		_ = c.SetDeadline(time.Now().Add(2 * time.Minute))
		answered := make(chan string, 1)
		go func() {
			resp, err := http.ReadResponse(bufio.NewReader(c), nil)
			if err != nil {
				answered <- err.Error()
				return
			}
			resp.Body.Close()
			answered <- resp.Status
		}()
		head := fmt.Sprintf("POST http://denied.example.org/ HTTP/1.1\r\nHost: denied.example.org\r\nContent-Length: %d\r\n\r\n", body)
		n, _ := io.Copy(c, io.MultiReader(strings.NewReader(head), io.LimitReader(zeros{}, body)))
		total += n
		t.Logf("connection %d: %s, %d bytes written", i, <-answered, n)
		c.Close()
	}
	if bound := int64(limit + conns*slack); total > bound {
		t.Errorf("the sandbox wrote %d bytes on %d refused requests, want at most %d: the proxy read past the job's max_bytes (%d)", total, conns, bound, limit)
	}
	// The lingers are in the job's summary, not in a decision of their own.
	s := h.proxy.Summary()
	if used := h.proxy.bytes.Load(); s.Lingered == 0 || used != s.BytesOut+s.BytesIn+s.Lingered || s.Requests != conns {
		t.Errorf("the job's cap has %d bytes used; its summary %+v, want %d requests and the lingered bytes", used, s, conns)
	}
}

type zeros struct{}

func (zeros) Read(b []byte) (int, error) {
	clear(b)
	return len(b), nil
}
