//go:build faults

package main

import (
	"fmt"
	"net/http"
	"net/http/httputil"
	"strconv"
	"strings"
	"sync"
)

// upload is one object an attempt began to upload: the job, the attempt's delivery number and
// its folder under runs/ID/attempts/.
type upload struct {
	jobID, folder string
	attempt       int
}

// storeProxy stands between one worker and versitygw. It passes every request on, except that,
// when armed, it holds the first upload of a run's object until released: the worker is then
// in the middle of an upload, which is where the harness pauses it.
type storeProxy struct {
	url string

	mu      sync.Mutex
	caught  chan upload   // non-nil while armed
	release chan struct{} // closed to let the held upload through
}

func newStoreProxy(target string) (*storeProxy, error) {
	p := &storeProxy{}
	var err error
	p.url, err = reverseProxy(target, func(rp *httputil.ReverseProxy) http.Handler {
		// With the server down the worker must see what it would without the proxy: a
		// connection that fails, not a 502 answer.
		rp.ErrorHandler = func(w http.ResponseWriter, r *http.Request, err error) {
			if hj, ok := w.(http.Hijacker); ok {
				if c, _, herr := hj.Hijack(); herr == nil {
					c.Close()
					return
				}
			}
			w.WriteHeader(http.StatusBadGateway)
		}
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if up, ok := runUpload(r); ok {
				p.hold(up)
			}
			rp.ServeHTTP(w, r)
		})
	})
	if err != nil {
		return nil, err
	}
	return p, nil
}

// arm makes the proxy hold the next upload of a run's object; the channel reports it.
func (p *storeProxy) arm() <-chan upload {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.caught, p.release = make(chan upload, 1), make(chan struct{})
	return p.caught
}

// letGo lets the held upload (if any) through and disarms the proxy.
func (p *storeProxy) letGo() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.release != nil {
		close(p.release)
	}
	p.caught, p.release = nil, nil
}

func (p *storeProxy) hold(up upload) {
	p.mu.Lock()
	caught, release := p.caught, p.release
	p.caught = nil // one upload only
	p.mu.Unlock()
	if caught == nil {
		return
	}
	caught <- up
	<-release
}

// runUpload tells whether r puts an object of an attempt's folder, path style:
// /BUCKET/tenants/TENANT/runs/ID/attempts/N-RANDOM/NAME.
func runUpload(r *http.Request) (upload, bool) {
	if r.Method != http.MethodPut || r.URL.Query().Has("uploadId") { // a run's objects are small: one PUT each
		return upload{}, false
	}
	parts := strings.SplitN(strings.TrimPrefix(r.URL.Path, "/"), "/", 8)
	if len(parts) < 8 || parts[1] != "tenants" || parts[3] != "runs" || parts[5] != "attempts" {
		return upload{}, false
	}
	parts = parts[2:] // TENANT, runs, ID, attempts, N-RANDOM, NAME
	n, _, _ := strings.Cut(parts[4], "-")
	attempt, err := strconv.Atoi(n)
	if err != nil {
		return upload{}, false
	}
	return upload{jobID: parts[2], folder: parts[4], attempt: attempt}, true
}

func (u upload) String() string {
	return fmt.Sprintf("%s attempt %d (%s)", u.jobID, u.attempt, u.folder)
}
