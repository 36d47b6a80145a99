//go:build integration

package store_test

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"

	"github.com/boxcar-run/boxcar/internal/store"
	"github.com/boxcar-run/boxcar/internal/store/s3test"
)

var oneMiB = bytes.Repeat([]byte("boxcar\x00\xff"), 1<<20/8)

// BenchmarkWriteFile1MiB is the floor: os.WriteFile, no fsync, no rename.
func BenchmarkWriteFile1MiB(b *testing.B) {
	name := filepath.Join(b.TempDir(), "object")
	b.SetBytes(int64(len(oneMiB)))
	for b.Loop() {
		if err := os.WriteFile(name, oneMiB, 0o640); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkWriteFileSync1MiB adds the fsync that makes an object durable.
func BenchmarkWriteFileSync1MiB(b *testing.B) {
	name := filepath.Join(b.TempDir(), "object")
	b.SetBytes(int64(len(oneMiB)))
	for b.Loop() {
		f, err := os.Create(name)
		if err != nil {
			b.Fatal(err)
		}
		if _, err := f.Write(oneMiB); err != nil {
			b.Fatal(err)
		}
		if err := f.Sync(); err != nil {
			b.Fatal(err)
		}
		if err := f.Close(); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkFilePut1MiB(b *testing.B) {
	s, err := store.NewFile(b.TempDir())
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	benchmarkPut(b, s)
}

func BenchmarkS3Put1MiB(b *testing.B) {
	srv := s3test.Start(b)
	srv.Env(b)
	s, err := store.NewS3(b.Context(), srv.CreateBucket(b), "", store.Options{Endpoint: srv.Endpoint, PathStyle: true})
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	benchmarkPut(b, s)
}

func benchmarkPut(b *testing.B, s store.Store) {
	ctx := b.Context()
	b.SetBytes(int64(len(oneMiB)))
	for b.Loop() {
		if err := s.Put(ctx, "runs/bench/artifacts/object", bytes.NewReader(oneMiB), int64(len(oneMiB))); err != nil {
			b.Fatal(err)
		}
	}
}
