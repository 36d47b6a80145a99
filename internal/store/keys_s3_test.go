//go:build integration

package store_test

import (
	"errors"
	"io"
	"slices"
	"strings"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/s3"

	"github.com/boxcar-run/boxcar/internal/store"
	"github.com/boxcar-run/boxcar/internal/store/s3test"
)

// edgeKeys are keys store.WritableKey lets Boxcar write (an artifact's name is the sandbox's
// choice), each with characters XML escapes, URL encoding treats specially, or UTF-8 of one to
// four bytes at the edges of what XML 1.0 carries.
var edgeKeys = []string{
	`artifacts/xml & <tags> "quoted" 'single'`,
	"artifacts/url+plus%2Fpercent?query#frag=1;semi",
	"artifacts/ spaces  around ",
	"artifacts/\u00e9\u00a0nbsp\u2028line-sep\ufffd",
	"artifacts/\ud7ff\ue000\ufffd\U0001F600\U0010FFFD",
	"artifacts/slash~tilde`tick|pipe{}[]^",
}

// TestS3KeysWithoutURLEncoding: every key store.WritableKey allows is written, listed as
// itself, read, listed as an unfinished upload as itself and discarded, and deleted, on
// versitygw, which ignores the listing's encoding-type=url (its keys come plain in XML), and
// on SeaweedFS, which honours it.
func TestS3KeysWithoutURLEncoding(t *testing.T) {
	for _, server := range []struct {
		name  string
		start func(testing.TB) *s3test.Server
	}{{"versitygw", s3test.Start}, {"seaweedfs", s3test.StartSeaweed}} {
		t.Run(server.name, func(t *testing.T) {
			srv := server.start(t)
			srv.Env(t)
			bucket := srv.CreateBucket(t)
			st := newS3(t, srv, bucket, "tenants/t", store.Options{})
			checkEdgeKeys(t, st, rawClient(srv), bucket, "tenants/t/")
		})
	}
}

func checkEdgeKeys(t *testing.T, st *store.S3, raw *s3.Client, bucket, prefix string) {
	t.Helper()
	ctx := t.Context()
	for _, k := range edgeKeys {
		if !store.WritableKey(k) {
			t.Fatalf("%q is not a key Boxcar writes", k)
		}
		if err := st.PutIfAbsent(ctx, k, strings.NewReader(k), int64(len(k))); err != nil {
			t.Fatalf("put %q: %v", k, err)
		}
	}
	// SeaweedFS stores a backslash as a slash, and would list the key as another.
	if err := st.PutIfAbsent(ctx, `artifacts/back\slash`, strings.NewReader("x"), 1); !errors.Is(err, store.ErrInvalidKey) {
		t.Errorf("put of a key with a backslash: %v, want ErrInvalidKey", err)
	}
	objs, err := st.List(ctx, "artifacts/")
	if err != nil {
		t.Fatal(err)
	}
	var listed []string
	for _, o := range objs {
		listed = append(listed, o.Key)
	}
	if want := slices.Sorted(slices.Values(edgeKeys)); !slices.Equal(listed, want) {
		t.Errorf("listed %q, want %q", listed, want)
	}
	for _, k := range edgeKeys {
		rc, err := st.Get(ctx, k)
		if err != nil {
			t.Errorf("get %q: %v", k, err)
			continue
		}
		b, err := io.ReadAll(rc)
		rc.Close()
		if err != nil || string(b) != k {
			t.Errorf("get %q: %q, %v", k, b, err)
		}
		full := prefix + k
		up, err := raw.CreateMultipartUpload(ctx, &s3.CreateMultipartUploadInput{Bucket: &bucket, Key: &full})
		if err != nil {
			t.Fatalf("start an upload of %q: %v", k, err)
		}
		if _, err := raw.UploadPart(ctx, &s3.UploadPartInput{Bucket: &bucket, Key: &full, UploadId: up.UploadId, PartNumber: aws.Int32(1), Body: strings.NewReader("part")}); err != nil {
			t.Fatalf("upload a part of %q: %v", k, err)
		}
		partials, err := store.Partials(ctx, st, "artifacts/")
		if err != nil || len(partials) != 1 || partials[0].Key != k {
			t.Errorf("unfinished uploads %+v, %v; want %q alone", partials, err, k)
		}
		for _, p := range partials {
			if err := store.DiscardPartial(ctx, st, p); err != nil {
				t.Errorf("discard the upload of %q: %v", p.Key, err)
			}
		}
		if left, err := store.Partials(ctx, st, "artifacts/"); err != nil || len(left) != 0 {
			t.Errorf("after discarding the upload of %q: %+v, %v", k, left, err)
		}
		if err := st.Delete(ctx, k); err != nil {
			t.Errorf("delete %q: %v", k, err)
		}
	}
	if objs, err := st.List(ctx, "artifacts/"); err != nil || len(objs) != 0 {
		t.Errorf("after deleting every key: %+v, %v", objs, err)
	}
}
