package egress

import (
	"errors"
	"io"
	"strings"
	"testing"
	"testing/iotest"
	"time"
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

// TestMultipartBodyReadsPartsSplitAcrossReads: multipartBody reads a multipart body the same
// however its bytes arrive, one at a time or whole: what goes on is the body, byte for byte,
// or, for a part naming a refused method in any way PHP or Rack reads one, the body cut before
// its end, the read failing with the refusal.
func TestMultipartBodyReadsPartsSplitAcrossReads(t *testing.T) {
	part := func(disposition, value string) string {
		return "--b\r\nContent-Disposition: " + disposition + "\r\n\r\n" + value + "\r\n"
	}
	file := "--b\r\nContent-Disposition: form-data; name=\"f\"; filename=\"a.bin\"\r\nContent-Type: application/octet-stream\r\n\r\n" +
		strings.Repeat("x-y\r\n-\n", 3*maxFormBytes/7) + "\r\n"
	for _, tt := range []struct {
		name, body string
		refused    bool
	}{
		{"PATCH", part(`form-data; name="_method"`, "PATCH") + "--b--\r\n", false},
		{"a file, then PATCH", file + part(`form-data; name="_method"`, "PATCH") + "--b--\r\n", false},
		{"another name", part(`form-data; name="method"`, "TRACE") + "--b--\r\n", false},
		{"a value over 64 KiB", part(`form-data; name="_method"`, strings.Repeat("x", maxFormBytes+1)) + "--b--\r\n", false},
		{"a value over 64 KiB at the body's end", part(`form-data; name="_method"`, strings.Repeat(" ", maxFormBytes+1)+"TRACE"), false},
		{"a value over 64 KiB holding a part", part(`form-data; name="_method"`, strings.Repeat("x", maxFormBytes)+part(`form-data; name="_method"`, "TRACE")), true},
		{"a header block under 64 KiB", "--b\r\nContent-Disposition: form-data; name=_method\r\n" + strings.Repeat("X-A: b\r\n", maxFormBytes/8-4) + "\r\nPATCH\r\n--b--", false},
		{"a long line after a name, over 64 KiB", "name=" + strings.Repeat(" ", 2*maxFormBytes) + "_method", true},
		{"the value TRACE--", part(`form-data; name="_method"`, "PATCH--TRACE") + "--b--\r\n", false},
		{"no part", "name=", false},
		{"a long line after a name= (a minified script)", file[:200] + "a.name=" + strings.Repeat("x", 2*maxFormBytes) + "\r\n--b--\r\n", false},
		{"TRACE", part(`form-data; name="_method"`, "TRACE") + "--b--\r\n", true},
		{"trace, at the body's end", part(`form-data; name="_method"`, "trace"), true},
		{"after a file", file + part(`form-data; name="_method"`, "TRACE") + "--b--\r\n", true},
		{"after PATCH", part(`form-data; name="_method"`, "PATCH") + part(`form-data; name="_method"`, "TRACK") + "--b--\r\n", true},
		{"bare LFs", "--b\nContent-Disposition: form-data; name=\"_method\"\n\nCONNECT\n--b--\n", true},
		{"folded", part("form-data;\r\n name=\"_method\"", "TRACE") + "--b--\r\n", true},
		{"folded inside the name", part("form-data; name=\"_met\r\n\thod\"", "TRACE") + "--b--\r\n", true},
		{"after a filename", part(`form-data; filename="a"; name="_method"`, "TRACE") + "--b--\r\n", true},
		{"unquoted", part(`form-data; name=_method`, "TRACE") + "--b--\r\n", true},
		{"single quotes", part(`form-data; name='_method'`, "TRACE") + "--b--\r\n", true},
		{"a ; in the quotes, where PHP splits", part(`form-data; name="_method;x"`, "TRACE") + "--b--\r\n", true},
		{"NAME, .method", part(`form-data; NAME=".method"`, "TRACE") + "--b--\r\n", true},
		{"a list", part(`form-data; name="_method"`, "GET, TRACE") + "--b--\r\n", true},
		{"RFC 2231's name*", part(`form-data; name*=utf-8''%5Fmethod`, "TRACE") + "--b--\r\n", true},
		{"unquoted, ended by a vertical tab (PHP's isspace, Rack's strip)", part("form-data; name=_method\v", "TRACE") + "--b--\r\n", true},
		{"unquoted, ended by a form feed", part("form-data; name=_method\f", "TRACE") + "--b--\r\n", true},
		{"unquoted, ended by a CR alone (PHP)", part("form-data; name=_method\rx", "TRACE") + "--b--\r\n", true},
		{"a backslash escape in the quotes (Rack 3, busboy)", part(`form-data; name="\_meth\od"`, "TRACE") + "--b--\r\n", true},
		{"a Content-ID, Rack's name for a part with none", "--b\r\nContent-Disposition: form-data\r\ncontent-ID: _method\r\n\r\nTRACE\r\n--b--\r\n", true},
		{"no line end before the delimiter (Rack 1)", "--b\r\nContent-Disposition: form-data; name=\"_method\"\r\n\r\nTRACE--b--\r\n", true},
		{"a name over 64 KiB", part(`form-data; name="`+strings.Repeat(" ", maxFormBytes+1)+`_method"`, "TRACE"), true},
		{"a header block over 64 KiB", "--b\r\nContent-Disposition: form-data; name=_method\r\n" + strings.Repeat("X-A: b\r\n", maxFormBytes/8+1) + "\r\nPATCH\r\n--b--", true},
	} {
		for _, split := range []bool{false, true} {
			var r io.Reader = strings.NewReader(tt.body)
			if split {
				r = iotest.OneByteReader(r)
			}
			got, err := io.ReadAll(&multipartBody{ReadCloser: io.NopCloser(r)})
			var fr *formRefusal
			switch {
			case !tt.refused && (err != nil || string(got) != tt.body):
				t.Errorf("%s (one byte a read: %v): read %d bytes (%v), want the body whole", tt.name, split, len(got), err)
			case tt.refused && (!errors.As(err, &fr) || fr.v.reason != ReasonMethod || !strings.HasPrefix(tt.body, string(got)) || len(got) >= len(tt.body)):
				t.Errorf("%s (one byte a read: %v): read %d bytes (%v), want it cut and refused", tt.name, split, len(got), err)
			}
		}
	}
}

// TestMultipartBodyDenseWithNamesGoesOn: a body of many names goes on whole in about the time
// of any other. Each name was read to its header line's end, 64 KiB for a long line, and each
// name inside that line read again to the same end: 256 KiB of "name=" on one line took two
// minutes, 10 MB of it hours of the worker's CPU.
func TestMultipartBodyDenseWithNamesGoesOn(t *testing.T) {
	for _, body := range []string{
		strings.Repeat("name=", 2<<20/5),
		strings.Repeat("name=a; ", 2<<20/8),
		strings.Repeat("Content-Disposition: form-data; name=\"f\"\r\n", 2<<20/43),
	} {
		start := time.Now()
		got, err := io.ReadAll(&multipartBody{ReadCloser: io.NopCloser(strings.NewReader(body))})
		if err != nil || string(got) != body {
			t.Errorf("%.20q...: read %d bytes (%v), want the body whole", body, len(got), err)
		}
		if d := time.Since(start); d > time.Minute {
			t.Errorf("%.20q...: 2 MiB read in %v, want well under a minute", body, d)
		}
	}
}
