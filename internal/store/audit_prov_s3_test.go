//go:build integration

package store_test

import (
	"slices"
	"strings"
	"testing"

	"github.com/boxcar-run/boxcar/internal/store"
	"github.com/boxcar-run/boxcar/internal/store/s3test"
)

// TestAuditProvS3ListReturnsTheKeysPutTook: a key with U+FFFE or U+FFFF (valid UTF-8, not a
// control or format character, so the runner's artifactName takes it as an artifact's name)
// is stored and read back by its key, but ListObjectsV2 answers in XML, which cannot carry
// those characters: versitygw lists it as U+FFFD, and the store's List passes that on (AWS S3
// would send the raw character, which the SDK's XML decoder refuses, failing the whole List).
// List asks for no encoding-type=url. So `submit verify` notes the real artifact as "not
// named by the manifest" under a key that does not exist, and `submit gc` deletes that
// non-existent key and leaves the object of an unnamed attempt folder behind for ever.
//
// Want: every key Put took is listed as itself (or Put/the runner refuses such a key).
func TestAuditProvS3ListReturnsTheKeysPutTook(t *testing.T) {
	srv := s3test.Start(t)
	srv.Env(t)
	bucket := srv.CreateBucket(t)
	st := newS3(t, srv, bucket, "", store.Options{})
	for _, key := range []string{"runs/20261205t000000-000000000000/attempts/1-00000000/artifacts/a\uffff", "runs/20261205t000000-000000000000/attempts/1-00000000/artifacts/b\ufffe"} {
		if err := st.PutIfAbsent(t.Context(), key, strings.NewReader("x"), 1); err != nil {
			continue // refused: fine
		}
		objs, err := st.List(t.Context(), "runs/")
		if err != nil {
			t.Errorf("list after putting %q: %v", key, err)
			continue
		}
		if !slices.ContainsFunc(objs, func(o store.ObjectInfo) bool { return o.Key == key }) {
			var keys []string
			for _, o := range objs {
				keys = append(keys, o.Key)
			}
			t.Errorf("the store took %q but List does not return it; it lists %q", key, keys)
		}
	}
}
