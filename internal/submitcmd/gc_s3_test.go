//go:build integration

package submitcmd

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/boxcar-run/boxcar/internal/job"
	"github.com/boxcar-run/boxcar/internal/store"
	"github.com/boxcar-run/boxcar/internal/store/s3test"
)

// newS3TestEnv is a testEnv whose store is a new bucket on versitygw, its credentials in the
// environment; args are the flags that point a submit command at it.
func newS3TestEnv(t *testing.T) (te *testEnv, srv *s3test.Server, bucket string, args []string) {
	t.Helper()
	srv = s3test.Start(t)
	srv.Env(t)
	bucket = srv.CreateBucket(t)
	te = newTestEnv(t)
	st, err := store.Open(t.Context(), "s3://"+bucket, store.Options{Endpoint: srv.Endpoint, PathStyle: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	te.st = store.ForTenant(st, job.DefaultTenant) // what submit reads: the tenant's folder
	return te, srv, bucket, []string{"--store", "s3://" + bucket, "--s3-endpoint", srv.Endpoint}
}

// TestGCS3 runs gc's cases on versitygw: the ages come from the listing's LastModified.
func TestGCS3(t *testing.T) {
	te, srv, bucket, args := newS3TestEnv(t)
	testGC(t, te, args, func(t *testing.T, key string, at time.Time) {
		// The posix backend keeps each object as a file and lists its mtime.
		if err := os.Chtimes(filepath.Join(srv.Dir, bucket, filepath.FromSlash(store.TenantPrefix(job.DefaultTenant)+key)), at, at); err != nil {
			t.Fatal(err)
		}
	})
}
