package egress

import (
	"errors"
	"io"
	"strings"
	"testing"
	"testing/iotest"
)

// TestFormBodyReadsNamesSplitAcrossReads: formBody reads a form the same however its bytes
// arrive, one at a time (a name or a value split across every read boundary) or whole: what
// goes on is the body, byte for byte, or, for a refused _method, the body cut before the
// refused pair's last byte, the read failing with the refusal.
func TestFormBodyReadsNamesSplitAcrossReads(t *testing.T) {
	for _, tt := range []struct {
		body    string
		refused bool
	}{
		{"a=1&_method=PATCH&b=2", false},
		{"_method", false},
		{"_method=PATCH=TRACE", false}, // the value is "PATCH=TRACE", no method
		{"a=_method=TRACE&b=%zz", false},
		{"_method=%zzTRACE", false}, // PHP reads "%zzTRACE", no method
		{"&&=&;;a", false},
		{"a=" + strings.Repeat("x", 3*maxFormBytes) + "&_method=PATCH", false},
		{strings.Repeat("a", maxFormBytes) + "=1", false}, // at the cap: its "=" is no part of it
		{strings.Repeat("a", maxFormBytes) + "&b=1", false},
		{"_method=" + strings.Repeat("x", maxFormBytes) + "&b=1", false},
		{"_method=" + strings.Repeat("x", maxFormBytes), false},
		{"_method=TRACE", true},
		{"_method=TRACE&b=2", true},
		{"a=1;_method=trace;b", true},
		{"%5Fmethod=TRACE", true},
		{"+.method=TR%41CE", true},
		{"_method%00x=GET,%20TRACE&", true},
		{"&&=&;;_method=CONNECT", true},
		{strings.Repeat("a&", 10001) + "_method=TRACK", true},
		{strings.Repeat("a", maxFormBytes+1) + "=1", true},
		{"_method=" + strings.Repeat("x", maxFormBytes+1), true},
	} {
		for _, split := range []bool{false, true} {
			var r io.Reader = strings.NewReader(tt.body)
			if split {
				r = iotest.OneByteReader(r)
			}
			got, err := io.ReadAll(&formBody{ReadCloser: io.NopCloser(r)})
			var fr *formRefusal
			switch {
			case !tt.refused && (err != nil || string(got) != tt.body):
				t.Errorf("%.40q (one byte a read: %v): read %d bytes (%v), want the body whole", tt.body, split, len(got), err)
			case tt.refused && (!errors.As(err, &fr) || fr.v.reason != ReasonMethod || !strings.HasPrefix(tt.body, string(got)) || len(got) >= len(tt.body)):
				t.Errorf("%.40q (one byte a read: %v): read %d bytes (%v), want it cut and refused", tt.body, split, len(got), err)
			}
		}
	}
}
