//go:build integration

package store_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/boxcar-run/boxcar/internal/store"
	"github.com/boxcar-run/boxcar/internal/store/s3test"
	"github.com/boxcar-run/boxcar/internal/testnet"
)

func newProxied(t *testing.T, p *s3test.LenientProxy, bucket string, opts store.Options) *store.S3 {
	t.Helper()
	opts.Endpoint, opts.PathStyle = p.URL, true
	s, err := store.NewS3(t.Context(), bucket, "boxcar", opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

func TestS3Probe(t *testing.T) {
	srv := s3test.Start(t)
	srv.Env(t)
	ctx := t.Context()
	manifest := store.ManifestKey("20261202t101500-abcdef012345")

	t.Run("honest server", func(t *testing.T) {
		p := s3test.NewLenientProxy(t, srv, s3test.IgnoreNothing)
		bucket := srv.CreateBucket(t)
		s := newProxied(t, p, bucket, store.Options{})
		if err := store.Probe(ctx, s); err != nil {
			t.Fatalf("Probe on versitygw: %v", err)
		}
		// The proof holds for a while: readiness may call Probe on every check.
		before := p.Requests.Load()
		if err := store.Probe(ctx, s); err != nil {
			t.Fatal(err)
		}
		if n := p.Requests.Load() - before; n != 0 {
			t.Errorf("a second Probe at once sent %d requests, want 0", n)
		}
		// Another store on the same bucket finds the probe object and proves it refused.
		if err := store.Probe(ctx, newProxied(t, p, bucket, store.Options{})); err != nil {
			t.Errorf("Probe of a second store: %v", err)
		}
		if err := s.PutIfAbsent(ctx, manifest, strings.NewReader("{}"), 2); err != nil {
			t.Fatal(err)
		}
		if keys, err := s.List(ctx, ""); err != nil || len(keys) != 1 || keys[0].Key != manifest {
			t.Errorf("List = %+v, %v; want the manifest only, not the store's probe object", keys, err)
		}
		if info, err := s.Stat(ctx, store.ProbeKey); err != nil || info.ContentType != "text/plain; charset=utf-8" {
			t.Errorf("Stat(%s) = %+v, %v; want the probe object, as text", store.ProbeKey, info, err)
		}
	})

	for _, ignore := range []string{s3test.IgnorePut, s3test.IgnoreComplete} {
		t.Run("ignores If-None-Match on "+ignore, func(t *testing.T) {
			p := s3test.NewLenientProxy(t, srv, ignore)
			bucket := srv.CreateBucket(t)
			s := newProxied(t, p, bucket, store.Options{})
			err := store.Probe(ctx, s)
			if !errors.Is(err, store.ErrUnsafeServer) {
				t.Fatalf("Probe = %v, want ErrUnsafeServer", err)
			}
			// The message names the server's behaviour and the setting that overrides it.
			for _, want := range []string{"If-None-Match", ignore, "store.allow_unsafe_overwrite"} {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("Probe error does not name %q: %v", want, err)
				}
			}
			// A create-only put is refused rather than silently overwriting.
			if err := s.PutIfAbsent(ctx, manifest, strings.NewReader("{}"), 2); !errors.Is(err, store.ErrUnsafeServer) {
				t.Errorf("PutIfAbsent on an unsafe server = %v, want ErrUnsafeServer", err)
			}
			if _, err := s.Stat(ctx, manifest); !errors.Is(err, store.ErrNotFound) {
				t.Errorf("the refused PutIfAbsent wrote %s: %v", manifest, err)
			}
			// The operator's override: the store runs, and says what it risks.
			allowed := newProxied(t, p, bucket, store.Options{AllowUnsafeOverwrite: true})
			if err := store.Probe(ctx, allowed); err != nil {
				t.Errorf("Probe with AllowUnsafeOverwrite = %v, want nil", err)
			}
			if err := allowed.PutIfAbsent(ctx, manifest, strings.NewReader("{}"), 2); err != nil {
				t.Errorf("PutIfAbsent with AllowUnsafeOverwrite = %v", err)
			}
		})
	}

	t.Run("unreachable", func(t *testing.T) {
		s, err := store.NewS3(ctx, "boxcar-none", "", store.Options{Endpoint: "http://" + testnet.ClosedAddr(t), PathStyle: true, MaxAttempts: 1})
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		if err := store.Probe(ctx, s); err == nil || errors.Is(err, store.ErrUnsafeServer) {
			t.Errorf("Probe of an unreachable server = %v, want an error that is not ErrUnsafeServer", err)
		}
	})

	t.Run("file store", func(t *testing.T) {
		if err := store.Probe(ctx, newFile(t)); err != nil {
			t.Errorf("Probe of a file store = %v, want nil", err)
		}
	})
}
