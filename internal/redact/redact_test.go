package redact_test

import (
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"os"
	"strings"
	"syscall"
	"testing"

	"github.com/boxcar-run/boxcar/internal/redact"
)

// secret is the password of every URL below: written as it is, it holds a '%' that is not an
// escape, so no URL parser reads it.
const secret = "Hunter2-s3cr%ZZet"

func TestURL(t *testing.T) {
	t.Parallel()
	tests := []struct{ name, in, want string }{
		{"no user", "nats://127.0.0.1:4222", "nats://127.0.0.1:4222"},
		{"user and password", "nats://ann:pw@host:4222", "nats://redacted@host:4222"},
		{"token", "https://tok@host/v1", "https://redacted@host/v1"},
		{"no scheme", "ann:pw@host:4222", "redacted@host:4222"},
		{"bare host and port", "127.0.0.1:4222", "127.0.0.1:4222"},
		{"bad escape in the password", "tls://boxcar:" + secret + "@host:4222", "tls://redacted@host:4222"},
		{"slash in the password", "https://boxcar:pa/ss@host/v1", "https://redacted@host/v1"},
		{"slash, no '@'", "https://boxcar:pa/ss" + secret, "<unparseable https URL>"},
		{"bad scheme", "ht tp://" + secret, "<unparseable URL>"},
		{"key in the query", "https://host/v1?api_key=s3cret&api-version=2024", "https://host/v1?api_key=redacted&api-version=redacted"},
		{"token as the whole query", "nats://host:4222/?s3cret", "nats://host:4222/?redacted"},
		{"empty query", "https://host/v1?", "https://host/v1?"},
		{"fragment", "https://host/v1#access_token=s3cret", "https://host/v1#redacted"},
		{"query and user", "s3://AKID:s3cret@bucket/p?X-Amz-Signature=s3cret", "s3://redacted@bucket/p?X-Amz-Signature=redacted"},
		{"no scheme, query", "host:4222?token=s3cret", "host:4222?token=redacted"},
		{"unparseable, query after the '@'", "tls://boxcar:" + secret + "@host:4222?token=s3cret", "tls://redacted@host:4222?redacted"},
		// A token or password whose '/', '?' or '#' is not escaped ends the authority early: what
		// comes before it reads as a host (and port), the rest and its '@' as a path or query.
		{"token with a slash", "nats://s3cret/91@127.0.0.1:4222", "nats://redacted@127.0.0.1:4222"},
		{"no scheme, token with a slash", "s3cret/91@127.0.0.1:4222", "redacted@127.0.0.1:4222"},
		{"digits, then a slash in the password", "nats://ann:5551/s3cret@host:4222", "nats://redacted@host:4222"},
		{"digits, then '?' in the password", "nats://ann:5551?s3cret@host:4222", "nats://redacted@host:4222"},
		{"digits, then '#' in the password", "https://ann:5551#s3cret@host/v1", "https://redacted@host/v1"},
		{"unparseable, fragment after the '@'", "https://boxcar:pa/ss@host/v1#s3cret", "https://redacted@host/v1?redacted"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			if got := redact.URL(tt.in); got != tt.want {
				t.Errorf("URL(%q) = %q, want %q", tt.in, got, tt.want)
			}
		})
	}
	if got, want := redact.URLList("nats://a:b@h1:4222, tls://c:"+secret+"@h2:4222"), "nats://redacted@h1:4222,tls://redacted@h2:4222"; got != want {
		t.Errorf("URLList = %q, want %q", got, want)
	}
}

// TestParseURLErrorHoldsNoInput: every way a credential can break a URL gives an error that
// says what kind of problem it is, wraps ErrBadURL, and holds no part of the password.
func TestParseURLErrorHoldsNoInput(t *testing.T) {
	t.Parallel()
	for _, in := range []string{
		"nats://boxcar:" + secret + "@h:4222",    // bad escape
		"https://boxcar:s3cr/et" + secret + "@h", // '/' ends the authority: a bad port
		"https://boxcar:s3cr?et" + secret + "@h", // '?' does too
		"https://boxcar:s3cr et" + secret + "@h", // a space in the host
		"https://boxcar:s3cr\x01et@h",            // a control character
		"https://[boxcar:s3cret@h",               // a '[' without ']'
	} {
		_, err := redact.ParseURL(in)
		if !errors.Is(err, redact.ErrBadURL) {
			t.Errorf("ParseURL(%q) = %v, want ErrBadURL", in, err)
			continue
		}
		for _, leak := range []string{"s3cr", "%ZZ", "boxcar"} {
			if strings.Contains(err.Error(), leak) {
				t.Errorf("ParseURL's error holds %q: %v", leak, err)
			}
		}
	}
	if err := redact.CheckURLList("127.0.0.1:4222, nats://a:b@h:4222", "nats"); err != nil {
		t.Errorf("CheckURLList of good URLs: %v", err)
	}
	for _, in := range []string{"nats://s3cr/et@h:4222", "s3cr/et@h:4222", "nats://boxcar:4222/s3cret@h:4222"} {
		err := redact.CheckURLList(in, "nats")
		if !errors.Is(err, redact.ErrBadURL) || strings.Contains(err.Error(), "s3cr") || strings.Contains(err.Error(), "boxcar") {
			t.Errorf("CheckURLList(%q) = %v, want ErrBadURL without the token", in, err)
		}
	}
	if _, err := redact.ParseHTTPURL("https://s3cr/et@h/v1"); !errors.Is(err, redact.ErrBadURL) || strings.Contains(err.Error(), "s3cr") {
		t.Errorf("ParseHTTPURL of a token with a slash = %v, want ErrBadURL without the token", err)
	}
	err := redact.CheckURLList("nats://h:4222,nats://a:"+secret+"@h:4222", "nats")
	if !errors.Is(err, redact.ErrBadURL) || !strings.Contains(err.Error(), "URL 2 of 2") || strings.Contains(err.Error(), "s3cr") {
		t.Errorf("CheckURLList = %v, want ErrBadURL naming URL 2 of 2 and not the password", err)
	}
}

func TestErrorWordsNameNoAddress(t *testing.T) {
	t.Parallel()
	refused := &url.Error{Op: "Put", URL: "http://127.0.0.1:9000/boxcar/x", Err: &net.OpError{Op: "dial", Net: "tcp",
		Addr: &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 9000}, Err: &os.SyscallError{Syscall: "connect", Err: syscall.ECONNREFUSED}}}
	tests := []struct {
		name string
		err  error
		want string
	}{
		{name: "nil", err: nil, want: ""},
		{name: "a refused dial keeps its errno's words", err: fmt.Errorf("store: put x: %w", refused), want: "connection refused"},
		{name: "a body cut short", err: fmt.Errorf("read: %w", io.ErrUnexpectedEOF), want: "unexpected EOF"},
		{name: "last words naming a host and port", err: errors.New("lookup on minio.local:9000"), want: "no answer"},
		{name: "last words naming an IP", err: errors.New("read from 10.0.0.1 failed"), want: "no answer"},
		{name: "last words naming a URL", err: errors.New("get https://example.com/x failed"), want: "no answer"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			if got := redact.ErrorWords(tt.err); got != tt.want {
				t.Errorf("ErrorWords(%v) = %q, want %q", tt.err, got, tt.want)
			}
		})
	}
}

func TestAddressesKeepsTheWordsAndDropsThePlaces(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name, text, want string
	}{
		{name: "a store's refused put",
			text: `store: put jobs/x: operation error S3: PutObject, https response error StatusCode: 0, RequestID: , HostID: , canceled: Put "http://127.0.0.1:39417/boxcar/jobs/x": dial tcp 127.0.0.1:39417: connect: connection refused`,
			want: `store: put jobs/x: operation error S3: PutObject, https response error StatusCode: 0, RequestID: , HostID: , canceled: Put [address]: dial tcp [address]: connect: connection refused`},
		{name: "a URL before a colon", text: "get https://minio.local/boxcar/x: operation error", want: "get [address]: operation error"},
		{name: "a store URL names an object, not a place", text: "store: stat s3://boxcar/tenants/default/runs/x/manifest.json: operation error", want: "store: stat s3://boxcar/tenants/default/runs/x/manifest.json: operation error"},
		{name: "a lookup", text: "dial tcp: lookup minio.storage.svc on 10.96.0.10:53: no such host", want: "dial tcp: lookup [address] on [address]: no such host"},
		{name: "a host and port", text: "read tcp minio.local:9000: i/o timeout", want: "read tcp [address]: i/o timeout"},
		{name: "both ends of a connection", text: "write tcp 10.1.2.3:50412->minio.local:9000: broken pipe", want: "write tcp [address]: broken pipe"},
		{name: "a job's own network rule", text: `egress: the job's network is wider than its profile's: "api.example.com:443" is not within the profile's allow list`, want: `egress: the job's network is wider than its profile's: "api.example.com:443" is not within the profile's allow list`},
		{name: "a file and line", text: "main.go:42: boom", want: "main.go:42: boom"},
		{name: "an IPv6 address", text: "dial tcp [::1]:4222: connect: connection refused", want: "dial tcp [address]: connect: connection refused"},
		{name: "no address", text: "model endpoint down since 2026-12-04T12:00:00Z (HTTP 503)", want: "model endpoint down since 2026-12-04T12:00:00Z (HTTP 503)"},
		{name: "a bracketed word", text: "HTTP 401: key [redacted] refused", want: "HTTP 401: key [redacted] refused"},
		{name: "words with colons", text: "job timed out after 10m0s: exit code 1", want: "job timed out after 10m0s: exit code 1"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			if got := redact.Addresses(tt.text); got != tt.want {
				t.Errorf("Addresses(%q)\n = %q\nwant %q", tt.text, got, tt.want)
			}
		})
	}
}

// TestHasUser: user information in any URL of a list counts, a query does not (the worker
// logs its NATS login as "url" by it).
func TestHasUser(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]bool{
		"nats://127.0.0.1:4222":                      false,
		"nats://127.0.0.1:4222/?token=x":             false,
		"nats://h1:4222, ann:pw@h2:4222":             true,
		"tok@host:4222":                              true,
		"tls://boxcar:" + secret + "@host:4222":      true,
		"nats://h:4222, nats://h2:4222?user=a@b.com": false,
	} {
		if got := redact.HasUser(in); got != want {
			t.Errorf("HasUser(%q) = %v, want %v", in, got, want)
		}
	}
}
