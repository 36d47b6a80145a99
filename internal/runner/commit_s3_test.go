//go:build integration

package runner_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/boxcar-run/boxcar/internal/job"
	"github.com/boxcar-run/boxcar/internal/provenance"
	"github.com/boxcar-run/boxcar/internal/runner"
	"github.com/boxcar-run/boxcar/internal/store"
	"github.com/boxcar-run/boxcar/internal/store/s3test"
)

// lostAnswerProxy stands in front of a real versitygw and plays a load balancer that passes
// the first create-only PUT of a key ending in suffix to the server, which takes it, and then
// loses the server's answer, answering 503 instead: the SDK's retryer sends the same PUT
// again, and the server refuses it (412) because the first one landed.
type lostAnswerProxy struct {
	URL  string
	lost atomic.Int64
}

func newLostAnswerProxy(t *testing.T, srv *s3test.Server, suffix string) *lostAnswerProxy {
	t.Helper()
	target, err := url.Parse(srv.Endpoint)
	if err != nil {
		t.Fatal(err)
	}
	p := &lostAnswerProxy{}
	rp := httputil.NewSingleHostReverseProxy(target)
	h := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodPut && r.Header.Get("If-None-Match") == "*" && strings.HasSuffix(r.URL.Path, suffix) &&
			!r.URL.Query().Has("uploadId") && p.lost.Load() == 0 {
			rec := httptest.NewRecorder()
			rp.ServeHTTP(rec, r)
			if rec.Code == http.StatusOK {
				p.lost.Add(1)
				w.Header().Set("Content-Type", "application/xml")
				w.WriteHeader(http.StatusServiceUnavailable)
				_, _ = w.Write([]byte(`<?xml version="1.0" encoding="UTF-8"?><Error><Code>ServiceUnavailable</Code><Message>upstream answer lost</Message></Error>`))
				return
			}
			for k, v := range rec.Header() {
				w.Header()[k] = v
			}
			w.WriteHeader(rec.Code)
			_, _ = w.Write(rec.Body.Bytes())
			return
		}
		rp.ServeHTTP(w, r)
	}))
	t.Cleanup(h.Close)
	p.URL = h.URL
	return p
}

// s3Bundle is setup's bundle with the store on versitygw, reached through endpoint.
func s3Bundle(t *testing.T, srv *s3test.Server, bucket, endpoint string) *bundle {
	t.Helper()
	b := setup(t)
	b.shared = newS3Store(t, srv, bucket, endpoint)
	b.store = store.ForTenant(b.shared, job.DefaultTenant)
	return b
}

// newS3Store opens bucket on versitygw through endpoint.
func newS3Store(t *testing.T, srv *s3test.Server, bucket, endpoint string) store.Store {
	t.Helper()
	vars := srv.Vars()
	st, err := store.NewS3(context.Background(), bucket, "", store.Options{Endpoint: endpoint, PathStyle: true,
		Getenv: func(k string) string { return vars[k] }})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	return st
}

// TestCommitKeepsARunWhoseManifestPutTheSDKRetried: on a real S3 server, the manifest's
// create-only PUT lands but its answer is lost (a 503 from a proxy, a reset connection); the
// AWS SDK retries it and the server answers 412 to the retry. That is the worker's own
// manifest, not another attempt's commit: the run it names stays whole and gets its
// signature. (The worker used to take it for errLeaseLost and remove every object the
// committed manifest names, the attempt's envelope with them.) The store is reached with the
// server's credentials (Vars), never the machine's.
func TestCommitKeepsARunWhoseManifestPutTheSDKRetried(t *testing.T) {
	t.Parallel()
	srv := s3test.Start(t)
	bucket := srv.CreateBucket(t)
	proxy := newLostAnswerProxy(t, srv, "/manifest.json")
	b := s3Bundle(t, srv, bucket, proxy.URL)
	priv, pub := signingKeys(t)
	b.worker(agentFunc(writeReport), func(c *runner.Config) { c.SigningKey = priv })
	j := b.submit("p")
	st := b.waitFinal(j.ID, 60*time.Second)
	if proxy.lost.Load() != 1 {
		t.Fatalf("the proxy lost %d answers, want 1", proxy.lost.Load())
	}
	t.Logf("final status: state %s error %q", st.State, st.Error)

	// Read the run straight from versitygw, not through the proxy.
	direct := store.ForTenant(newS3Store(t, srv, bucket, srv.Endpoint), job.DefaultTenant)
	report, err := provenance.Verify(context.Background(), direct, j.ID, pub)
	if err != nil || !report.OK() {
		for _, c := range report.Checks {
			t.Logf("check %s ok=%v skipped=%v: %s", c.Name, c.OK, c.Skipped, c.Reason)
		}
		t.Fatalf("the committed run does not verify: %v", err)
	}
}
