//go:build integration

package submitcmd

import (
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/s3"

	"github.com/boxcar-run/boxcar/internal/job"
	"github.com/boxcar-run/boxcar/internal/store"
	"github.com/boxcar-run/boxcar/internal/store/s3test"
)

// TestGCAbortsACrashedMultipartUpload: a worker killed in the middle of a multipart upload (an
// artifact or transcript past one 5 MiB part) leaves the upload open on S3, its parts stored
// and billed, invisible to ListObjects. gc --delete aborts it with the attempt folder's
// objects; otherwise only a bucket lifecycle rule would ever remove it.
func TestGCAbortsACrashedMultipartUpload(t *testing.T) {
	te, srv, bucket, args := newS3TestEnv(t)
	raw := s3.New(s3.Options{Region: s3test.Region, BaseEndpoint: aws.String(srv.Endpoint), UsePathStyle: true,
		Credentials: credentials.NewStaticCredentialsProvider(srv.AccessKey, srv.SecretKey, "")})
	ctx := t.Context()

	committed := te.commitRun(t, true)
	crashed := store.AttemptPrefix(committed, "2-deadbeef")
	if err := te.st.PutIfAbsent(ctx, crashed+"report.md", strings.NewReader("# r\n"), 4); err != nil {
		t.Fatal(err)
	}
	full := store.TenantPrefix(job.DefaultTenant) + crashed
	uploads := func() []string {
		out, err := raw.ListMultipartUploads(ctx, &s3.ListMultipartUploadsInput{Bucket: &bucket, Prefix: aws.String(full)})
		if err != nil {
			t.Fatal(err)
		}
		var keys []string
		for _, u := range out.Uploads {
			parts, err := raw.ListParts(ctx, &s3.ListPartsInput{Bucket: &bucket, Key: u.Key, UploadId: u.UploadId})
			if err == nil && len(parts.Parts) > 0 {
				keys = append(keys, aws.ToString(u.Key))
			}
		}
		return keys
	}
	crashMidPut(t, crashPutArgs{URL: "s3://" + bucket, Endpoint: srv.Endpoint, Key: crashed + "artifacts/big.bin", Size: 16 << 20},
		func() bool { return len(uploads()) > 0 })

	// Two days later, everything of the run is old (the posix backend lists file times).
	old := time.Now().Add(-48 * time.Hour)
	_ = filepath.WalkDir(srv.Dir, func(p string, d fs.DirEntry, err error) error {
		if err == nil {
			_ = os.Chtimes(p, old, old)
		}
		return nil
	})
	stdout, stderr, err := te.submit(t, append([]string{"gc", "--delete"}, args...)...)
	if err != nil {
		t.Fatalf("gc --delete: %v\n%s%s", err, stdout, stderr)
	}
	if !strings.Contains(stdout, "deleted       "+crashed) {
		t.Fatalf("gc --delete did not delete the crashed attempt's folder:\n%s", stdout)
	}
	if left := uploads(); len(left) > 0 {
		t.Errorf("after gc --delete removed the crashed attempt's folder, the bucket still holds the killed worker's multipart upload of %v with its parts: never aborted, never reclaimed\n%s", left, stdout)
	}
}

// TestGCAbortsAKilledSubmitsInputUpload: a `submit run` killed in a multipart upload of an
// input leaves it open under inputs/, outside every attempt folder; gc keeps it within the
// grace and aborts it once it is older, as it does on the file store.
func TestGCAbortsAKilledSubmitsInputUpload(t *testing.T) {
	te, srv, bucket, args := newS3TestEnv(t)
	raw := s3.New(s3.Options{Region: s3test.Region, BaseEndpoint: aws.String(srv.Endpoint), UsePathStyle: true,
		Credentials: credentials.NewStaticCredentialsProvider(srv.AccessKey, srv.SecretKey, "")})
	ctx := t.Context()
	uploads := func() int {
		out, err := raw.ListMultipartUploads(ctx, &s3.ListMultipartUploadsInput{Bucket: &bucket, Prefix: aws.String(store.TenantPrefix(job.DefaultTenant))})
		if err != nil {
			t.Fatal(err)
		}
		return len(out.Uploads)
	}
	key := store.InputKey(strings.Repeat("ab", 32))
	// The input's own upload: listed without its key, the first upload could be the one
	// store.Open's probe makes in the child before it puts anything (one part of its own), and
	// the child was killed in its probe, with no input upload begun.
	parts := func() bool {
		out, err := raw.ListMultipartUploads(ctx, &s3.ListMultipartUploadsInput{Bucket: &bucket, Prefix: aws.String(store.TenantPrefix(job.DefaultTenant) + key)})
		if err != nil || len(out.Uploads) == 0 {
			return false
		}
		u := out.Uploads[0]
		p, err := raw.ListParts(ctx, &s3.ListPartsInput{Bucket: &bucket, Key: u.Key, UploadId: u.UploadId})
		return err == nil && len(p.Parts) > 0
	}
	crashMidPut(t, crashPutArgs{URL: "s3://" + bucket, Endpoint: srv.Endpoint, Key: key, Size: 16 << 20}, parts)
	checkGCOfInputUpload(t, te, args, uploads, func(at time.Time) {
		_ = filepath.WalkDir(srv.Dir, func(p string, d fs.DirEntry, err error) error {
			if err == nil {
				_ = os.Chtimes(p, at, at)
			}
			return nil
		})
	})
}
