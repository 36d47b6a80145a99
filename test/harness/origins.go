package harness

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
)

// Recorder is an http.Handler that records each request that reaches it, as "METHOD /path"
// and Field=value for each header field named in Fields, before Handler answers it (nil: 404):
// a server that must get no request, or only some, and whose records say what leaked to it.
type Recorder struct {
	Fields  []string
	Handler http.Handler

	mu   sync.Mutex
	seen []string
}

func (rec *Recorder) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	line := []string{r.Method, r.URL.Path}
	for _, f := range rec.Fields {
		line = append(line, f+"="+r.Header.Get(f))
	}
	rec.mu.Lock()
	rec.seen = append(rec.seen, strings.Join(line, " "))
	rec.mu.Unlock()
	if rec.Handler == nil {
		http.NotFound(w, r)
		return
	}
	rec.Handler.ServeHTTP(w, r)
}

// Take returns the requests recorded since the last Take, oldest first.
func (rec *Recorder) Take() []string {
	rec.mu.Lock()
	defer rec.mu.Unlock()
	seen := rec.seen
	rec.seen = nil
	return seen
}

// RedirectingOrigins starts two origins, loopback servers on ports of their own (127.0.0.1:0)
// closed when the test ends, for the tests that hold a client's credentials to its origin: the
// endpoint redirects every request with status to the same path on the other, whose Recorder
// records each request that reaches it with fields and answers 404. Go's client would resend
// Authorization to the same host on another port, and any other field to any address.
func RedirectingOrigins(t testing.TB, status int, fields ...string) (endpoint *httptest.Server, other *Recorder) {
	t.Helper()
	other = &Recorder{Fields: fields}
	to := httptest.NewServer(other)
	t.Cleanup(to.Close)
	endpoint = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, to.URL+r.URL.Path, status)
	}))
	t.Cleanup(endpoint.Close)
	return endpoint, other
}
