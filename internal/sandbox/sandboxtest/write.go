package sandboxtest

import (
	"bytes"
	"errors"
	"io"
	"testing"
	"testing/iotest"

	"github.com/boxcar-run/boxcar/internal/sandbox"
)

// writeCases are the suite's cases for WriteFrom, the streaming write the runner copies
// inputs with.
var writeCases = []suiteTest{
	{"WriteFromStreams", testWriteFromStreams},
	{"WriteFromRefuses", testWriteFromRefuses},
}

func testWriteFromStreams(t *testing.T, p sandbox.Provider) {
	sb := Start(t, p)
	ctx := t.Context()
	data := bytes.Repeat(allBytes(), 4<<10) // 1 MiB, more than any buffer on the way
	// One byte a Read: a source that trickles arrives whole all the same.
	if err := sb.WriteFrom(ctx, "in/data.bin", iotest.OneByteReader(bytes.NewReader(data[:4096])), 4096); err != nil {
		t.Fatal(err)
	}
	if err := sb.WriteFrom(ctx, "in/big.bin", bytes.NewReader(data), int64(len(data))); err != nil {
		t.Fatal(err)
	}
	if err := sb.WriteFrom(ctx, "empty", bytes.NewReader(nil), 0); err != nil {
		t.Fatal(err)
	}
	for name, want := range map[string][]byte{"in/data.bin": data[:4096], "in/big.bin": data, "empty": nil} {
		got, err := sb.ReadFile(ctx, name, int64(len(data)))
		if err != nil || !bytes.Equal(got, want) {
			t.Errorf("%s: %d bytes, %v; want the %d written", name, len(got), err, len(want))
		}
	}
}

func testWriteFromRefuses(t *testing.T, p sandbox.Provider) {
	sb := Start(t, p)
	ctx := t.Context()
	boom := errors.New("source failed")
	tests := []struct {
		name string
		r    io.Reader
		size int64
		is   error // the error WriteFrom wraps, nil for any
	}{
		{name: "source shorter than its size", r: bytes.NewReader(make([]byte, 10)), size: 11},
		{name: "source longer than its size", r: bytes.NewReader(make([]byte, 12)), size: 11, is: sandbox.ErrTooLarge},
		{name: "source fails", r: io.MultiReader(bytes.NewReader(make([]byte, 5)), iotest.ErrReader(boom)), size: 11, is: boom},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := sb.WriteFrom(ctx, "refused.bin", tt.r, tt.size)
			if err == nil || (tt.is != nil && !errors.Is(err, tt.is)) {
				t.Errorf("WriteFrom = %v, want an error wrapping %v", err, tt.is)
			}
		})
	}
	if err := sb.WriteFrom(ctx, "../out.bin", bytes.NewReader(nil), 0); !errors.Is(err, sandbox.ErrPathEscape) {
		t.Errorf("WriteFrom ../out.bin = %v, want ErrPathEscape", err)
	}
}
