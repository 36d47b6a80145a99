package sandboxtest

import (
	"context"
	"errors"
	"strings"
	"syscall"
	"testing"

	"github.com/boxcar-run/boxcar/internal/sandbox"
)

// errnoCases are the suite's cases for the file errors a job's own files cause: each backend
// classes them alike, by the package's sentinels or the errno itself, which the runner tells
// as the job's (never as a fault of the worker's side). A pod's file script told a name too
// long as "no such file", or, writing, as an unclassed "ioerror"; bubblewrap told a write
// over a folder in words of no class.
var errnoCases = []suiteTest{
	{"FileErrnosClassed", testFileErrnosClassed},
}

// RunFileErrnos runs the suite's errno cases alone, for a backend whose set-up could change how
// its file operations' failures read (an image's language).
func RunFileErrnos(t *testing.T, p sandbox.Provider) {
	for _, tt := range errnoCases {
		t.Run(tt.name, func(t *testing.T) { tt.fn(t, p) })
	}
}

// longName is a path component past NAME_MAX (255 bytes).
var longName = strings.Repeat("n", 300)

func testFileErrnosClassed(t *testing.T, p sandbox.Provider) {
	sb := Start(t, p)
	Sh(t, sb, "mkdir folder && echo x > file && ln -s loop loop && mkdir -p deep/"+longName[:200])
	read := func(name string) func(context.Context) error {
		return func(ctx context.Context) error { _, err := sb.ReadFile(ctx, name, 1<<20); return err }
	}
	open := func(name string) func(context.Context) error {
		return func(ctx context.Context) error { _, err := openAll(ctx, sb, name, 1<<20); return err }
	}
	list := func(name string) func(context.Context) error {
		return func(ctx context.Context) error { _, err := sb.List(ctx, name); return err }
	}
	write := func(name string) func(context.Context) error {
		return func(ctx context.Context) error { return sb.WriteFile(ctx, name, []byte("x")) }
	}
	tests := []struct {
		name string
		do   func(context.Context) error
		is   error
	}{
		{"read of a name past NAME_MAX", read(longName), syscall.ENAMETOOLONG},
		{"read beneath a name past NAME_MAX", read(longName + "/f"), syscall.ENAMETOOLONG},
		{"open of a name past NAME_MAX", open(longName), syscall.ENAMETOOLONG},
		{"list of a name past NAME_MAX", list(longName), syscall.ENAMETOOLONG},
		{"write of a name past NAME_MAX", write(longName), syscall.ENAMETOOLONG},
		{"write of a name past NAME_MAX in an existing folder", write("folder/" + longName), syscall.ENAMETOOLONG},
		{"write beneath a name past NAME_MAX", write(longName + "/f"), syscall.ENAMETOOLONG},
		{"read through a file (ENOTDIR)", read("file/x"), sandbox.ErrNotFound},
		{"write beneath a file (ENOTDIR)", write("file/x"), sandbox.ErrNotFound},
		{"read of a folder (EISDIR)", read("folder"), sandbox.ErrNotRegular},
		{"write over a folder (EISDIR)", write("folder"), sandbox.ErrNotRegular},
		{"read of a symlink loop (ELOOP)", read("loop"), sandbox.ErrPathEscape},
		{"write beneath a symlink loop (ELOOP)", write("loop/x"), sandbox.ErrPathEscape},
		{"list of a symlink loop (ELOOP)", list("loop"), sandbox.ErrPathEscape},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if err := tt.do(t.Context()); !errors.Is(err, tt.is) {
				t.Errorf("err = %v, want one wrapping %v", err, tt.is)
			}
		})
	}
}
