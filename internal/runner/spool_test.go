package runner

import (
	"bytes"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/boxcar-run/boxcar/internal/sandbox"
	"github.com/boxcar-run/boxcar/internal/store"
)

// TestSpool: a transcript stays in memory while it is small and moves to an unlinked file
// once it is not; either way every try of the commit reads back exactly what was written.
func TestSpool(t *testing.T) {
	t.Parallel()
	line := func(n int) []byte { return append(bytes.Repeat([]byte("x"), n-1), '\n') }
	tests := []struct {
		name   string
		writes [][]byte
		inFile bool
	}{
		{name: "nothing", writes: nil},
		{name: "small", writes: [][]byte{line(100), line(200)}},
		{name: "exactly the memory", writes: [][]byte{line(spoolMemory - 10), line(10)}},
		{name: "one byte over", writes: [][]byte{line(spoolMemory - 10), line(11)}, inFile: true},
		{name: "one large write", writes: [][]byte{line(3 * spoolMemory)}, inFile: true},
		{name: "many writes after the move", writes: [][]byte{line(spoolMemory), line(5), line(spoolMemory), line(7)}, inFile: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			dir := t.TempDir()
			s := &spool{dir: dir}
			defer s.close()
			var want []byte
			for _, w := range tt.writes {
				if n, err := s.Write(w); err != nil || n != len(w) {
					t.Fatalf("Write(%d bytes) = %d, %v", len(w), n, err)
				}
				want = append(want, w...)
			}
			if got := s.f != nil; got != tt.inFile {
				t.Errorf("in a file = %v, want %v", got, tt.inFile)
			}
			if left, err := os.ReadDir(dir); err != nil || len(left) != 0 {
				t.Errorf("temporary folder holds %v (%v), want nothing: the file is unlinked", left, err)
			}
			out := s.output()
			if out.size != int64(len(want)) {
				t.Errorf("output size = %d, want %d", out.size, len(want))
			}
			for try := range 2 {
				rc, err := out.open(t.Context())
				if err != nil {
					t.Fatal(err)
				}
				got, err := io.ReadAll(rc)
				rc.Close()
				if err != nil || !bytes.Equal(got, want) {
					t.Errorf("try %d read %d bytes (%v), want the %d written", try+1, len(got), err, len(want))
				}
			}
		})
	}
}

// TestSpoolFolderGone: a transcript that must move to a folder that cannot take it fails its
// write and every later one, and cannot be uploaded cut short; a small one never needs it.
func TestSpoolFolderGone(t *testing.T) {
	t.Parallel()
	gone := filepath.Join(t.TempDir(), "gone")
	small := &spool{dir: gone}
	if _, err := small.Write([]byte("{}\n")); err != nil {
		t.Fatalf("small write: %v, want it kept in memory", err)
	}
	s := &spool{dir: gone}
	defer s.close()
	_, err := s.Write(make([]byte, spoolMemory+1))
	if err == nil || !strings.Contains(err.Error(), "TMPDIR") {
		t.Fatalf("large write: %v, want an error that names TMPDIR", err)
	}
	if _, again := s.Write([]byte("{}\n")); again == nil {
		t.Error("a write after the failed one was taken")
	}
	if _, err := s.output().open(t.Context()); err == nil {
		t.Error("the output of a failed spool opened: it would upload a transcript cut short")
	}
}

// TestNewChecksTheTemporaryFolder: a worker whose temporary folder cannot take a file does
// not start, rather than failing the first job whose transcript grows.
func TestNewChecksTheTemporaryFolder(t *testing.T) {
	t.Parallel()
	type (
		noQueue   struct{ Queue }
		noSandbox struct{ sandbox.Provider }
		noStore   struct{ store.Store }
		noAgent   struct{ Agent }
	)
	cfg := Config{Queue: noQueue{}, Sandboxes: noSandbox{}, Store: noStore{}, Agent: noAgent{}, TempDir: filepath.Join(t.TempDir(), "gone")}
	cfg.Worker.Concurrency = 1
	if _, err := New(cfg); err == nil || !strings.Contains(err.Error(), "TMPDIR") {
		t.Fatalf("New = %v, want an error that names TMPDIR", err)
	}
	cfg.TempDir = t.TempDir()
	if _, err := New(cfg); err != nil {
		t.Fatalf("New with a writable folder: %v", err)
	}
}
