//go:build integration

package store_test

import (
	"strings"
	"testing"

	"github.com/aws/aws-sdk-go-v2/service/s3"

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
	t.Run("list carries every key", func(t *testing.T) {
		// A key no plain XML listing carries, written by another tool (or a Boxcar before
		// store.WritableKey): List asks for keys URL-encoded and decodes them, so it is listed
		// as itself; plain, versitygw lists it as U+FFFD, and AWS's raw answer fails the SDK.
		bucket := srv.CreateBucket(t)
		key := "runs/20261205t000000-000000000000/attempts/1-00000000/artifacts/a\uffff b+c"
		if _, err := rawClient(srv).PutObject(t.Context(), &s3.PutObjectInput{Bucket: &bucket, Key: &key, Body: strings.NewReader("x")}); err != nil {
			t.Fatal(err)
		}
		objs, err := newS3(t, srv, bucket, "", store.Options{}).List(t.Context(), "runs/")
		if err != nil || len(objs) != 1 || objs[0].Key != key {
			t.Errorf("List = %+v, %v; want %q alone", objs, err, key)
		}
	})
	t.Run("create-only proof", func(t *testing.T) {
		if err := store.Probe(t.Context(), newS3(t, srv, srv.CreateBucket(t), "", store.Options{})); err != nil {
			t.Errorf("Probe on SeaweedFS: %v", err)
		}
	})
}
