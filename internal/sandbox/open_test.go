package sandbox

import (
	"errors"
	"io"
	"strings"
	"testing"
	"testing/iotest"
)

// TestCappedReader: a file that grew past the cap after it was measured fails the read that
// passes it, with the bytes before it delivered; one within the cap reads whole.
func TestCappedReader(t *testing.T) {
	tests := []struct {
		name    string
		data    string
		max     int64
		wantErr error
	}{
		{name: "shorter", data: "abc", max: 10},
		{name: "exactly the cap", data: "abcdefghij", max: 10},
		{name: "one byte over", data: "abcdefghijk", max: 10, wantErr: ErrTooLarge},
		{name: "far over", data: strings.Repeat("x", 100_000), max: 10, wantErr: ErrTooLarge},
		{name: "empty at cap zero", data: "", max: 0},
		{name: "a byte at cap zero", data: "x", max: 0, wantErr: ErrTooLarge},
	}
	for _, tt := range tests {
		for _, reader := range []struct {
			name string
			r    func(string) io.Reader
		}{
			{"whole", func(s string) io.Reader { return strings.NewReader(s) }},
			{"a byte at a time", func(s string) io.Reader { return iotest.OneByteReader(strings.NewReader(s)) }},
		} {
			t.Run(tt.name+"/"+reader.name, func(t *testing.T) {
				got, err := io.ReadAll(&cappedReader{r: reader.r(tt.data), left: tt.max, op: "open", name: "f", max: tt.max})
				if !errors.Is(err, tt.wantErr) {
					t.Fatalf("err = %v, want %v", err, tt.wantErr)
				}
				if int64(len(got)) > tt.max {
					t.Errorf("read %d bytes past a cap of %d", len(got), tt.max)
				}
				if tt.wantErr == nil && string(got) != tt.data {
					t.Errorf("read %q, want %q", got, tt.data)
				}
			})
		}
	}
}
