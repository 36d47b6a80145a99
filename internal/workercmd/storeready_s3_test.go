//go:build integration

package workercmd

import (
	"errors"
	"strings"
	"testing"

	"github.com/boxcar-run/boxcar/internal/store"
	"github.com/boxcar-run/boxcar/internal/store/s3test"
)

// TestStoreReadySaysWhatToChange: a worker the store refuses (its secret key is not its
// access key's) is not ready, and /readyz says so as the store's refusal does, with what to
// change, not the bare "Forbidden" a HEAD's answer carries (it has no body to name the cause).
func TestStoreReadySaysWhatToChange(t *testing.T) {
	t.Parallel()
	srv := s3test.StartIAM(t)
	srv.CreateUser(t, "worker")
	srv.CreateOwnedBucket(t, "worker", "boxcar-ready")
	vars := srv.UserVars("worker", "not-the-secret-key-of-worker")
	st, err := store.NewS3(t.Context(), "boxcar-ready", "", store.Options{Endpoint: srv.Endpoint, PathStyle: true, Getenv: func(k string) string { return vars[k] }})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	err = storeReady(t.Context(), st)
	t.Logf("storeReady: %v", err)
	if !errors.Is(err, store.ErrWorkerRefused) || err == nil || !strings.Contains(err.Error(), "AWS_SECRET_ACCESS_KEY") {
		t.Errorf("storeReady: %v; want the worker's refusal (%v), saying to correct AWS_SECRET_ACCESS_KEY", err, store.ErrWorkerRefused)
	}
}
