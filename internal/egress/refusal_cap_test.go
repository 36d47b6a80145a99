package egress

import (
	"errors"
	"io"
	"net"
	"testing"
	"time"
)

// TestRefusalsCountAgainstTheRequestCap: a sandbox looping on requests the proxy refuses
// before it admits them (a method, a smuggling shape, a Host that disagrees, a request cap
// reached) had each one read, parsed and decided, for ever: max_requests did not count them,
// and past max_bytes they went on unanswered, each still a decision (a transcript line, a
// log line, a metric) and the worker's time to read up to max_header_bytes. Every request
// read counts now, the first past the cap is answered request_cap, and the proxy reads no
// later one: it closes it unread, counted in the summary's closed_unread.
func TestRefusalsCountAgainstTheRequestCap(t *testing.T) {
	const maxReqs, tries = 3, 40
	refused := []string{
		"TRACE http://plain.example.com/ HTTP/1.1\r\nHost: plain.example.com\r\n\r\n",
		postPlain("Content-Length: 5\r\nTransfer-Encoding: chunked\r\n"),
		getReq("http://plain.example.com/", "other.example.com"),
		connectReq("a.files.example.com"),
	}
	h := setup(t, func(c *Config) { c.Limits.MaxRequests = maxReqs })
	for i := range tries {
		c := h.dialProxy(t)
		if err := c.SetDeadline(time.Now().Add(10 * time.Second)); err != nil {
			t.Fatal(err)
		}
		// The proxy may close the connection before it reads the request: what it sends back
		// is what matters.
		_, _ = io.WriteString(c, refused[i%len(refused)])
		if _, err := io.ReadAll(c); err != nil && !isReset(err) {
			t.Fatalf("request %d: %v", i, err)
		}
		c.Close()
	}
	if got := len(h.all()); got != maxReqs+1 {
		t.Errorf("%d refused requests with max_requests %d made %d decisions, want %d: the ones in the cap and one request_cap", tries, maxReqs, got, maxReqs+1)
	}
	if last := h.all()[len(h.all())-1]; last.Reason != ReasonRequestCap {
		t.Errorf("the last decision %+v, want request_cap", last)
	}
	if s := h.proxy.Summary(); s.Requests != maxReqs+1 || s.ClosedUnread != tries-maxReqs-1 {
		t.Errorf("summary: %d requests, %d closed unread; want %d and %d", s.Requests, s.ClosedUnread, maxReqs+1, tries-maxReqs-1)
	}
}

// isReset is a read that a close with bytes unread on the proxy's side ended.
func isReset(err error) bool {
	var ne *net.OpError
	return errors.As(err, &ne)
}
