//go:build integration

package store_test

import (
	"testing"

	"github.com/boxcar-run/boxcar/internal/store"
	"github.com/boxcar-run/boxcar/internal/store/s3test"
	"github.com/boxcar-run/boxcar/internal/store/storetest"
)

// TestSeaweedFS runs the s3 store against a second S3 implementation, SeaweedFS: the whole
// conformance suite (the create-only race included), the content types a plain HEAD is
// served, and the proof that the server refuses a second create-only put.
func TestSeaweedFS(t *testing.T) {
	srv := s3test.StartSeaweed(t)
	srv.Env(t)
	t.Run("conformance", func(t *testing.T) {
		storetest.Run(t, func(t *testing.T) store.Store {
			return newS3(t, srv, srv.CreateBucket(t), "boxcar", store.Options{PartSize: 5 << 20})
		})
	})
	t.Run("content types", func(t *testing.T) {
		checkHeadContentTypes(t, newS3(t, srv, srv.CreateBucket(t), "tenant", store.Options{PartSize: 5 << 20}), rawClient(srv))
	})
	t.Run("create-only proof", func(t *testing.T) {
		if err := store.Probe(t.Context(), newS3(t, srv, srv.CreateBucket(t), "", store.Options{})); err != nil {
			t.Errorf("Probe on SeaweedFS: %v", err)
		}
	})
}
