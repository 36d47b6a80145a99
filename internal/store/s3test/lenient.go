package s3test

import (
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"sync/atomic"
	"testing"
)

// What a LenientProxy ignores If-None-Match on.
const (
	IgnoreNothing  = ""
	IgnorePut      = "PutObject"
	IgnoreComplete = "CompleteMultipartUpload"
)

// LenientProxy stands in front of a real S3 server and plays one that ignores If-None-Match:
// it answers a conditional request of the kind it ignores with success itself, as such a
// server would after overwriting (it cannot strip the header: the request's signature covers
// it). Everything else goes through. It counts requests. Ignore changes what it ignores while
// it runs, as a server that is reconfigured or replaced behind the same address would.
type LenientProxy struct {
	URL      string
	Requests atomic.Int64
	ignore   atomic.Value // string
}

// Ignore makes the proxy ignore If-None-Match on what from now on (IgnoreNothing: honour it).
func (p *LenientProxy) Ignore(what string) { p.ignore.Store(what) }

// NewLenientProxy starts a proxy to srv that ignores If-None-Match on ignore, until the test
// ends.
func NewLenientProxy(t testing.TB, srv *Server, ignore string) *LenientProxy {
	t.Helper()
	target, err := url.Parse(srv.Endpoint)
	if err != nil {
		t.Fatal(err)
	}
	p := &LenientProxy{}
	p.Ignore(ignore)
	rp := httputil.NewSingleHostReverseProxy(target)
	h := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		p.Requests.Add(1)
		conditional := r.Header.Get("If-None-Match") == "*"
		ignore := p.ignore.Load().(string)
		switch {
		case conditional && ignore == IgnorePut && r.Method == http.MethodPut && !r.URL.Query().Has("uploadId"):
			w.Header().Set("ETag", `"0123456789abcdef0123456789abcdef"`)
			w.WriteHeader(http.StatusOK)
		case conditional && ignore == IgnoreComplete && r.Method == http.MethodPost && r.URL.Query().Has("uploadId"):
			w.Header().Set("Content-Type", "application/xml")
			_, _ = w.Write([]byte(`<?xml version="1.0" encoding="UTF-8"?><CompleteMultipartUploadResult><Key>k</Key><ETag>"0123456789abcdef0123456789abcdef-1"</ETag></CompleteMultipartUploadResult>`))
		default:
			rp.ServeHTTP(w, r)
		}
	}))
	t.Cleanup(h.Close)
	p.URL = h.URL
	return p
}
