//go:build integration

package store_test

import (
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/aws/aws-sdk-go-v2/service/s3"

	"github.com/boxcar-run/boxcar/internal/store"
	"github.com/boxcar-run/boxcar/internal/store/s3test"
	"github.com/boxcar-run/boxcar/internal/store/storetest"
	"github.com/boxcar-run/boxcar/internal/testnet"
	"github.com/boxcar-run/boxcar/test/harness"
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

// TestSeaweedListensOnlyOnItsPorts: the harness's weed listens on the ports it picked and no
// other. A part left on its default port (the S3 gateway's Lance namespace server on 9101,
// the admin's gRPC on 22535 and its legacy one on 33646) is taken by the first of two test
// binaries running at once, and the other's weed fails or talks to the first's.
func TestSeaweedListensOnlyOnItsPorts(t *testing.T) {
	srv := s3test.StartSeaweed(t)
	given := srv.Ports()
	var listening []string
	harness.Wait(t, "weed to listen on every port it was given", func() (bool, error) {
		var err error
		listening, err = testnet.ListeningAddrs(srv.Pid())
		for _, addr := range given {
			if !slices.Contains(listening, addr) {
				return false, fmt.Errorf("listening on %v, not yet on %s (err %v)", listening, addr, err)
			}
		}
		return err == nil, err
	})
	for _, addr := range listening {
		if !slices.Contains(given, addr) {
			t.Errorf("weed listens on %s, which the harness did not give it (given %v)", addr, given)
		}
	}
}
