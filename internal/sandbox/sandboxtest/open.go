package sandboxtest

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"io"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/boxcar-run/boxcar/internal/sandbox"
)

// openCases are the suite's cases for Open, the streaming read the runner uploads artifacts
// with: the bytes as written, the caps, and no symlink followed, inside the workdir or out.
var openCases = []suiteTest{
	{"OpenStreams", testOpenStreams},
	{"OpenRefuses", testOpenRefuses},
	{"OpenStoppedByClose", testOpenStoppedByClose},
	{"ReadRefusesUnreadable", testReadRefusesUnreadable},
}

// openAll reads a whole file through Open.
func openAll(ctx context.Context, sb sandbox.Sandbox, name string, maxBytes int64) ([]byte, error) {
	rc, err := sb.Open(ctx, name, maxBytes)
	if err != nil {
		return nil, err
	}
	defer rc.Close()
	return io.ReadAll(rc)
}

func testOpenStreams(t *testing.T, p sandbox.Provider) {
	sb := Start(t, p)
	ctx := t.Context()
	data := allBytes()
	for _, name := range []string{"bytes.bin", "a/b/c/bytes.bin", "with space/ünï.txt"} {
		if err := sb.WriteFile(ctx, name, data); err != nil {
			t.Fatal(err)
		}
		got, err := openAll(ctx, sb, name, int64(len(data)))
		if err != nil || !bytes.Equal(got, data) {
			t.Errorf("Open %s: %d bytes, err %v; want the %d bytes written", name, len(got), err, len(data))
		}
	}
	if err := sb.WriteFile(ctx, "empty", nil); err != nil {
		t.Fatal(err)
	}
	if got, err := openAll(ctx, sb, "empty", 0); err != nil || len(got) != 0 {
		t.Errorf("Open empty with maxBytes 0 = %q, %v; want nothing and no error", got, err)
	}

	// A file larger than any buffer on the way, read in small pieces, arrives whole.
	const big = 6<<20 + 123
	Sh(t, sb, "head -c 6291579 /dev/zero > big.bin")
	rc, err := sb.Open(ctx, "big.bin", big)
	if err != nil {
		t.Fatal(err)
	}
	h := sha256.New()
	n, err := io.CopyBuffer(h, rc, make([]byte, 1000))
	rc.Close()
	if want := sha256.Sum256(make([]byte, big)); err != nil || n != big || !bytes.Equal(h.Sum(nil), want[:]) {
		t.Errorf("Open big.bin: %d bytes, err %v; want %d zero bytes", n, err, big)
	}
	// A reader closed before its end frees the sandbox for the next call.
	rc, err = sb.Open(ctx, "big.bin", big)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.ReadFull(rc, make([]byte, 10)); err != nil {
		t.Fatal(err)
	}
	if err := rc.Close(); err != nil {
		t.Errorf("Close of a reader half read: %v", err)
	}
	if got, err := openAll(ctx, sb, "bytes.bin", int64(len(data))); err != nil || !bytes.Equal(got, data) {
		t.Errorf("Open after a reader closed early: %d bytes, err %v", len(got), err)
	}
}

func testOpenRefuses(t *testing.T, p sandbox.Provider) {
	sb := Start(t, p)
	ctx := t.Context()
	if err := sb.WriteFile(ctx, "ten.bin", make([]byte, 10)); err != nil {
		t.Fatal(err)
	}
	if err := sb.WriteFile(ctx, "d/b.txt", []byte("bb")); err != nil {
		t.Fatal(err)
	}
	Sh(t, sb, "ln -s ten.bin link && ln -s d dlink && ln -s /etc/passwd passwd && ln -s missing dangling && ln -s loop loop && mkfifo fifo")
	tests := []struct {
		name     string
		maxBytes int64
		want     error // nil: any error
	}{
		{name: "ten.bin", maxBytes: 9, want: sandbox.ErrTooLarge},
		{name: "missing", maxBytes: 100, want: sandbox.ErrNotFound},
		{name: "missing/deeper", maxBytes: 100, want: sandbox.ErrNotFound},
		{name: "ten.bin/below-a-file", maxBytes: 100, want: sandbox.ErrNotFound},
		{name: "../x", maxBytes: 100, want: sandbox.ErrPathEscape},
		{name: "/etc/passwd", maxBytes: 1 << 20, want: sandbox.ErrPathEscape},
		// No link is followed, not even one that stays inside the workdir, nor one on the way.
		{name: "link", maxBytes: 100, want: sandbox.ErrPathEscape},
		{name: "dlink/b.txt", maxBytes: 100, want: sandbox.ErrPathEscape},
		{name: "passwd", maxBytes: 1 << 20, want: sandbox.ErrPathEscape},
		{name: "dangling", maxBytes: 100},
		{name: "loop", maxBytes: 100},
		{name: "d", maxBytes: 100},
		{name: "fifo", maxBytes: 100},
	}
	for _, tt := range tests {
		begin := time.Now()
		got, err := openAll(ctx, sb, tt.name, tt.maxBytes)
		switch {
		case err == nil:
			t.Errorf("Open %s = %q, want an error", tt.name, got)
		case tt.want != nil && !errors.Is(err, tt.want):
			t.Errorf("Open %s: err = %v, want %v", tt.name, err, tt.want)
		}
		if took := time.Since(begin); took > 10*time.Second {
			t.Errorf("Open %s took %v; it must answer at once", tt.name, took)
		}
	}
	// What Open refuses for its links, ReadFile still reads when the link stays inside.
	if got, err := sb.ReadFile(ctx, "dlink/b.txt", 100); err != nil || string(got) != "bb" {
		t.Errorf("ReadFile dlink/b.txt = %q, %v; want \"bb\" through the link inside", got, err)
	}
}

// testOpenStoppedByClose: a reader open while the sandbox closes fails its next reads, and the
// sandbox's Close finishes once the reader is closed.
func testOpenStoppedByClose(t *testing.T, p sandbox.Provider) {
	sb := Start(t, p)
	ctx := context.WithoutCancel(t.Context())
	Sh(t, sb, "head -c 8388608 /dev/zero > big.bin")
	rc, err := sb.Open(ctx, "big.bin", 8<<20)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.ReadFull(rc, make([]byte, 10)); err != nil {
		t.Fatal(err)
	}
	closed := make(chan error, 1)
	go func() { closed <- sb.Close(ctx) }()
	waitFor(t, 20*time.Second, "the sandbox to refuse calls", func() bool {
		_, err := sb.List(ctx, ".")
		return errors.Is(err, sandbox.ErrClosed)
	})
	var readErr error
	waitFor(t, 20*time.Second, "a read to fail", func() bool {
		_, readErr = rc.Read(make([]byte, 10))
		return readErr != nil
	})
	if errors.Is(readErr, io.EOF) {
		t.Errorf("a read after Close: err = EOF, want the read stopped (8 MiB were left)")
	}
	if !strings.Contains(readErr.Error(), "sandbox") {
		t.Errorf("a read after Close: err = %v, want the sandbox to say why", readErr)
	}
	rc.Close()
	select {
	case err := <-closed:
		if err != nil {
			t.Errorf("Close: %v", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("Close still waiting 30s after the reader was closed")
	}
}

// testReadRefusesUnreadable: a file the job made unreadable is either read (a backend that
// reads as the worker's host user, who owns the workdir) or refused as permission denied
// (syscall.EACCES) by ReadFile and Open alike: the job's own doing, which the manifest tells
// as such, never a failure of the worker's side.
func testReadRefusesUnreadable(t *testing.T, p sandbox.Provider) {
	sb := Start(t, p)
	ctx := t.Context()
	Sh(t, sb, "echo secret > unreadable && chmod 0 unreadable")
	reads := map[string]func() ([]byte, error){
		"ReadFile": func() ([]byte, error) { return sb.ReadFile(ctx, "unreadable", 100) },
		"Open":     func() ([]byte, error) { return openAll(ctx, sb, "unreadable", 100) },
	}
	for name, read := range reads {
		got, err := read()
		if (err != nil || string(got) != "secret\n") && !errors.Is(err, syscall.EACCES) {
			t.Errorf("%s of a file of mode 0 = %q, err %v; want its bytes or permission denied (EACCES)", name, got, err)
		}
	}
}
