package bodyend_test

import (
	"errors"
	"io"
	"strings"
	"testing"

	"github.com/boxcar-run/boxcar/internal/bodyend"
)

// brokenReader gives its text, then err.
type brokenReader struct {
	r   io.Reader
	err error
}

func (b *brokenReader) Read(p []byte) (int, error) {
	n, err := b.r.Read(p)
	if errors.Is(err, io.EOF) {
		return n, b.err
	}
	return n, err
}

func TestWatchCallsEndOnceWithHowTheBodyEnded(t *testing.T) {
	t.Parallel()
	broke := errors.New("connection reset")
	tests := []struct {
		name    string
		body    io.Reader
		read    bool // read to the end before Close
		wantErr error
	}{
		{name: "read to its end", body: strings.NewReader("answer"), read: true},
		{name: "closed before its end", body: strings.NewReader("answer")},
		{name: "broken off", body: &brokenReader{r: strings.NewReader("ans"), err: broke}, read: true, wantErr: broke},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			var calls int
			var got error
			rc := bodyend.Watch(io.NopCloser(tt.body), func(readErr error) { calls++; got = readErr })
			if tt.read {
				_, _ = io.ReadAll(rc)
				_, _ = rc.Read(make([]byte, 1)) // a read after the end
			}
			_ = rc.Close()
			if calls != 1 || !errors.Is(got, tt.wantErr) || (tt.wantErr == nil && got != nil) {
				t.Errorf("end called %d times with %v; want once with %v", calls, got, tt.wantErr)
			}
		})
	}
}
