//go:build integration

package store_test

import (
	"bytes"
	"context"
	"errors"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/aws/aws-sdk-go-v2/service/s3/types"

	"github.com/boxcar-run/boxcar/internal/store"
	"github.com/boxcar-run/boxcar/internal/store/s3test"
	"github.com/boxcar-run/boxcar/internal/store/storetest"
	"github.com/boxcar-run/boxcar/internal/testnet"
)

// newS3 returns a store on srv's bucket under prefix, closed at the end of the test.
func newS3(t testing.TB, srv *s3test.Server, bucket, prefix string, opts store.Options) *store.S3 {
	t.Helper()
	opts.Endpoint = srv.Endpoint
	opts.PathStyle = true
	s, err := store.NewS3(t.Context(), bucket, prefix, opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func TestS3(t *testing.T) {
	srv := s3test.Start(t)
	srv.Env(t)
	t.Run("bucket", func(t *testing.T) {
		storetest.Run(t, func(t *testing.T) store.Store {
			return newS3(t, srv, srv.CreateBucket(t), "", store.Options{})
		})
	})
	// The smallest parts S3 allows make the large cases multipart uploads with a short last
	// part, and the 10 MiB unknown-size case exactly two parts.
	t.Run("prefix_small_parts", func(t *testing.T) {
		bucket := srv.CreateBucket(t)
		n := 0
		storetest.Run(t, func(t *testing.T) store.Store {
			n++
			return newS3(t, srv, bucket, "tenant/"+strings.Repeat("x", n), store.Options{PartSize: 5 << 20})
		})
	})
}

func TestS3Open(t *testing.T) {
	srv := s3test.Start(t)
	srv.Env(t)
	bucket := srv.CreateBucket(t)
	st, err := store.Open(t.Context(), "s3://"+bucket+"/boxcar/prod", store.Options{Endpoint: srv.Endpoint, PathStyle: true})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	key := store.ManifestKey("20261202t101500-abcdef012345")
	if err := st.PutIfAbsent(t.Context(), key, strings.NewReader("{}"), 2); err != nil {
		t.Fatal(err)
	}
	if got, want := st.URL(key), "s3://"+bucket+"/boxcar/prod/"+key; got != want {
		t.Errorf("URL = %q, want %q", got, want)
	}
	// versitygw's posix backend keeps the object as a plain file: the prefix is in its path.
	data, err := os.ReadFile(filepath.Join(srv.Dir, bucket, "boxcar", "prod", filepath.FromSlash(key)))
	if err != nil || string(data) != "{}" {
		t.Errorf("object not at its prefixed key: %q, %v", data, err)
	}
}

// rawClient talks to srv without the store, to look at what the store left there.
func rawClient(srv *s3test.Server) *s3.Client {
	return s3.New(s3.Options{
		Region:       s3test.Region,
		BaseEndpoint: aws.String(srv.Endpoint),
		UsePathStyle: true,
		Credentials:  credentials.NewStaticCredentialsProvider(srv.AccessKey, srv.SecretKey, ""),
	})
}

func TestS3ChecksumsAndAbandonedUploads(t *testing.T) {
	srv := s3test.Start(t)
	srv.Env(t)
	bucket := srv.CreateBucket(t)
	s := newS3(t, srv, bucket, "", store.Options{PartSize: 5 << 20})
	ctx := t.Context()
	raw := rawClient(srv)

	// A single put and a multipart put both carry SHA-256 checksums the server kept.
	small, large := []byte("report"), bytes.Repeat([]byte("0123456789abcdef"), 6<<20/16)
	for key, body := range map[string][]byte{"small": small, "large": large} {
		if err := s.PutIfAbsent(ctx, key, bytes.NewReader(body), int64(len(body))); err != nil {
			t.Fatal(err)
		}
		head, err := raw.HeadObject(ctx, &s3.HeadObjectInput{Bucket: &bucket, Key: aws.String(key), ChecksumMode: types.ChecksumModeEnabled})
		if err != nil {
			t.Fatal(err)
		}
		if aws.ToString(head.ChecksumSHA256) == "" {
			t.Errorf("object %s has no SHA-256 checksum", key)
		}
	}

	// A multipart PutIfAbsent that loses at completion aborts its upload.
	other := bytes.Repeat([]byte("x"), 6<<20)
	if err := s.PutIfAbsent(ctx, "large", bytes.NewReader(other), -1); !errors.Is(err, store.ErrExists) {
		t.Fatalf("losing multipart PutIfAbsent error = %v, want ErrExists", err)
	}
	// So does one whose reader fails after the first part.
	boom := errors.New("reader broke")
	body := &failAfter{r: bytes.NewReader(other), n: 5<<20 + 10, err: boom}
	if err := s.Put(ctx, "broken", body, -1); !errors.Is(err, boom) {
		t.Fatalf("Put with a failing reader error = %v, want the reader's error", err)
	}
	uploads, err := raw.ListMultipartUploads(ctx, &s3.ListMultipartUploadsInput{Bucket: &bucket})
	if err != nil {
		t.Fatal(err)
	}
	if len(uploads.Uploads) != 0 {
		t.Errorf("%d multipart uploads left behind, the first for %s", len(uploads.Uploads), aws.ToString(uploads.Uploads[0].Key))
	}
	if got := readAll(t, s, "large"); !bytes.Equal(got, large) {
		t.Errorf("the losing PutIfAbsent changed the object")
	}
	if _, err := s.Stat(ctx, "broken"); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("after a failed Put Stat error = %v, want ErrNotFound", err)
	}
}

// TestS3ContentTypes puts an object of every kind and reads its Content-Type back with a
// plain HEAD (what `aws s3api head-object` shows and a browser is served), not through the
// store.
func TestS3ContentTypes(t *testing.T) {
	srv := s3test.Start(t)
	srv.Env(t)
	checkHeadContentTypes(t, newS3(t, srv, srv.CreateBucket(t), "tenant", store.Options{PartSize: 5 << 20}), rawClient(srv))
}

func checkHeadContentTypes(t *testing.T, s *store.S3, raw *s3.Client) {
	t.Helper()
	ctx := t.Context()
	bucket, prefix, _ := strings.Cut(strings.TrimPrefix(s.URL(""), "s3://"), "/")
	for _, key := range storetest.ContentTypeKeys() {
		if err := s.PutIfAbsent(ctx, key, strings.NewReader("x"), 1); err != nil {
			t.Fatal(err)
		}
		head, err := raw.HeadObject(ctx, &s3.HeadObjectInput{Bucket: &bucket, Key: aws.String(prefix + key)})
		if err != nil {
			t.Fatal(err)
		}
		if got, want := aws.ToString(head.ContentType), store.ContentType(key); got != want {
			t.Errorf("HEAD %s: Content-Type %q, want %q", key, got, want)
		}
	}
	// A multipart upload too (the smallest part size, one byte more).
	key := store.AttemptPrefix("20261202t101500-000000000001", "1-0a1b2c3d") + "report.md"
	body := bytes.Repeat([]byte("# report\n"), (5<<20)/9+1)
	if err := s.Put(ctx, key, bytes.NewReader(body), -1); err != nil {
		t.Fatal(err)
	}
	head, err := raw.HeadObject(ctx, &s3.HeadObjectInput{Bucket: &bucket, Key: aws.String(prefix + key)})
	if err != nil {
		t.Fatal(err)
	}
	if got := aws.ToString(head.ContentType); got != "text/markdown; charset=utf-8" {
		t.Errorf("HEAD %s (multipart): Content-Type %q, want text/markdown; charset=utf-8", key, got)
	}
}

// TestS3DeadStore checks that an unreachable store fails fast and says why.
func TestS3DeadStore(t *testing.T) {
	srv := s3test.Start(t)
	srv.Env(t)
	bucket := srv.CreateBucket(t)
	stopped := newS3(t, srv, bucket, "", store.Options{})
	if err := stopped.Put(t.Context(), "before", strings.NewReader("x"), 1); err != nil {
		t.Fatal(err)
	}
	srv.Stop()
	never, err := store.NewS3(t.Context(), bucket, "", store.Options{Endpoint: "http://" + testnet.ClosedAddr(t), PathStyle: true})
	if err != nil {
		t.Fatal(err)
	}
	defer never.Close()

	for name, s := range map[string]*store.S3{"stopped": stopped, "never started": never} {
		ops := map[string]func(ctx context.Context) error{
			"put":           func(ctx context.Context) error { return s.Put(ctx, "k", strings.NewReader("x"), 1) },
			"put-if-absent": func(ctx context.Context) error { return s.PutIfAbsent(ctx, "k", strings.NewReader("x"), 1) },
			"get":           func(ctx context.Context) error { _, err := s.Get(ctx, "before"); return err },
			"stat":          func(ctx context.Context) error { _, err := s.Stat(ctx, "before"); return err },
			"list":          func(ctx context.Context) error { _, err := s.List(ctx, ""); return err },
		}
		for op, call := range ops {
			t.Run(name+"/"+op, func(t *testing.T) {
				// The context would stop a hang; the test wants the retries to give up first.
				ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
				defer cancel()
				start := time.Now()
				err := call(ctx)
				elapsed := time.Since(start)
				if !errors.Is(err, syscall.ECONNREFUSED) {
					t.Errorf("error = %v, want one that wraps ECONNREFUSED", err)
				}
				if errors.Is(err, store.ErrNotFound) || errors.Is(err, store.ErrExists) {
					t.Errorf("error = %v, an unreachable store must not look like an answer", err)
				}
				if elapsed > 5*time.Second {
					t.Errorf("took %s to give up, want under 5s", elapsed)
				}
				t.Logf("gave up after %s: %v", elapsed.Round(time.Millisecond), err)
			})
		}
	}
}

// TestS3SilentServer checks that a server which accepts and never answers cannot hold an
// operation past its context.
func TestS3SilentServer(t *testing.T) {
	s3test.IsolateEnv(t)
	t.Setenv("AWS_ACCESS_KEY_ID", "silent")
	t.Setenv("AWS_SECRET_ACCESS_KEY", "silent")
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	var mu sync.Mutex
	var conns []net.Conn
	wg.Go(func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
		}
	})
	t.Cleanup(func() {
		l.Close()
		wg.Wait()
		for _, c := range conns {
			c.Close()
		}
	})
	s, err := store.NewS3(t.Context(), "silent", "", store.Options{Endpoint: "http://" + l.Addr().String(), PathStyle: true})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	ctx, cancel := context.WithTimeout(t.Context(), 300*time.Millisecond)
	defer cancel()
	start := time.Now()
	err = s.Put(ctx, "k", strings.NewReader("x"), 1)
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("error = %v, want context.DeadlineExceeded", err)
	}
	if elapsed := time.Since(start); elapsed > 2*time.Second {
		t.Errorf("returned %s after the context's deadline of 300ms", elapsed)
	}
}

// failAfter returns err once n bytes of r have been read.
type failAfter struct {
	r   *bytes.Reader
	n   int
	err error
}

func (f *failAfter) Read(p []byte) (int, error) {
	if f.n <= 0 {
		return 0, f.err
	}
	if len(p) > f.n {
		p = p[:f.n]
	}
	n, err := f.r.Read(p)
	f.n -= n
	return n, err
}
