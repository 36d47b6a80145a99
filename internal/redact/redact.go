// Package redact owns how a URL that may carry credentials (a user and password, or a token,
// before its '@') is parsed and shown: in logs, /readyz, errors and check-config's output it
// never shows them. url.Parse and everything built on it (http.NewRequest, nats.go, the AWS
// SDK) quote the whole input in their errors, so a URL whose password needs escaping and is
// not escaped put that password in the message; ParseURL names the problem only. It also owns
// the words of an error that a status anyone may read shows (ErrorWords): never an address,
// which the log has. It does not own other secrets (API keys, tokens in files): those never
// reach a URL. A URL's query and fragment are shown masked too: a key where a URL has no use
// for one is refused where it is read (config.CheckURL), but one may still come (a URL read
// elsewhere).
package redact

import (
	"errors"
	"fmt"
	"net/url"
	"regexp"
	"strings"
)

// ErrBadURL is what ParseURL's errors wrap: the value does not parse as a URL.
var ErrBadURL = errors.New("does not parse as a URL")

// encodeHint is the fix for the usual cause: a password written as it is.
const encodeHint = "percent-encode %, /, ?, #, @ and : in a user name or password (%25 for %, %2F for /)"

// ParseURL is url.Parse with an error that holds no part of raw: the error says which kind of
// problem it is (url's own words up to the quoted piece of input) and how to fix the usual one.
// A URL with an '@' past its host is refused too (noAtAfterHost), whatever its scheme: a store
// URL s3://tok/en@bucket names the bucket "tok", as nats://tok/en@host dials the host "tok".
func ParseURL(raw string) (*url.URL, error) {
	u, err := url.Parse(raw)
	if err != nil {
		return nil, fmt.Errorf("%w (%s); %s", ErrBadURL, reason(err), encodeHint)
	}
	if err := noAtAfterHost(u); err != nil {
		return nil, err
	}
	return u, nil
}

// ParseHTTPURL is ParseURL for an http:// or https:// URL with a host: a model endpoint, an S3
// endpoint.
func ParseHTTPURL(raw string) (*url.URL, error) {
	u, err := ParseURL(raw)
	if err != nil {
		return nil, err
	}
	if (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("%s is not an http(s) URL with a host; use e.g. https://host/v1 or http://127.0.0.1:8000", URL(raw))
	}
	return u, nil
}

// atAfterHost reports whether u holds an '@' past its host: a user name, password or token
// with an unescaped '/', '?' or '#' ends the authority early, so its first part reads as the
// host (and port) and the rest, with its '@', as the path, query or fragment.
func atAfterHost(u *url.URL) bool {
	return strings.Contains(u.Opaque+u.EscapedPath()+u.RawQuery+u.EscapedFragment(), "@")
}

// noAtAfterHost refuses a URL with an '@' past its host: a client given it would dial the first
// part of a token or password as a host, and name that host in its errors.
func noAtAfterHost(u *url.URL) error {
	if atAfterHost(u) {
		return fmt.Errorf("%w (an '@' after the host); %s, and @ as %%40 where it belongs in a path", ErrBadURL, encodeHint)
	}
	return nil
}

// reason is url.Parse's problem without the input: its errors quote the offending piece
// (`invalid URL escape "%ZZ"`, `invalid port ":pa" after host`), which may be a password's.
func reason(err error) string {
	var ue *url.Error
	if errors.As(err, &ue) {
		err = ue.Err
	}
	s, _, _ := strings.Cut(err.Error(), `"`)
	s = strings.TrimSpace(strings.TrimPrefix(s, "net/url: "))
	if s == "" {
		return "malformed"
	}
	return s
}

// CheckURLList checks each comma-separated URL of list as ParseURL does, reading one without
// "://" as scheme://part, as the NATS client does. Its error names the URL by its position.
func CheckURLList(list, scheme string) error {
	parts := strings.Split(list, ",")
	for i, p := range parts {
		s := strings.TrimSpace(p)
		if s == "" {
			continue
		}
		if !strings.Contains(s, "://") {
			s = scheme + "://" + s
		}
		if _, err := ParseURL(s); err != nil {
			if len(parts) > 1 {
				return fmt.Errorf("URL %d of %d: %w", i+1, len(parts), err)
			}
			return err
		}
	}
	return nil
}

// schemeRE is a URL scheme (RFC 3986): safe to show from a URL that does not parse.
var schemeRE = regexp.MustCompile(`^[A-Za-z][A-Za-z0-9+.-]{0,31}$`)

// URL is raw for a log line or an error: its user information (a user and password, or a
// token) replaced by "redacted", and so is each value of its query (?api_key=redacted: the
// names say what was given, a value may be a key or a signature; a part without '=' may be a
// token and goes whole) and its fragment. A URL without a scheme ("user:pw@host:4222", as the
// NATS client takes it) keeps its form. One that does not parse shows its scheme and what
// follows its last '@' only, up to a '?' or '#' ("tls://redacted@host:4222?redacted"): no
// user information comes after that '@', whatever it holds before; without an '@' it shows
// as "<unparseable tls URL>". So does one that parses with an '@' past its host, which a
// token or password with an unescaped '/', '?' or '#' makes ("nats://tok/en@host" reads as the
// host "tok").
func URL(raw string) string {
	s := strings.TrimSpace(raw)
	bare := !strings.Contains(s, "://")
	if bare {
		s = "//" + s // let url.Parse see an authority
	}
	u, err := url.Parse(s)
	if err == nil && !atAfterHost(u) {
		if u.User != nil {
			u.User = url.User("redacted")
		}
		u.RawQuery = maskQuery(u.RawQuery)
		if u.Fragment != "" || u.RawFragment != "" {
			u.Fragment, u.RawFragment = "redacted", ""
		}
		if bare {
			return strings.TrimPrefix(u.String(), "//")
		}
		return u.String()
	}
	scheme, _, ok := strings.Cut(s, "://")
	if !ok || !schemeRE.MatchString(scheme) {
		scheme = ""
	}
	at := strings.LastIndex(s, "@")
	rest := s[at+1:]
	if i := strings.IndexAny(rest, "?#"); i >= 0 {
		rest = rest[:i] + "?redacted"
	}
	switch {
	case at >= 0 && scheme != "":
		return scheme + "://redacted@" + rest
	case at >= 0:
		return "redacted@" + rest
	case scheme != "":
		return "<unparseable " + scheme + " URL>"
	}
	return "<unparseable URL>"
}

// HasUser reports whether a URL of the comma-separated list carries user information: one
// that does not parse counts when it holds an '@', which may end some.
func HasUser(list string) bool {
	for _, p := range strings.Split(list, ",") {
		s := strings.TrimSpace(p)
		if !strings.Contains(s, "://") {
			s = "//" + s
		}
		u, err := url.Parse(s)
		if (err != nil && strings.Contains(s, "@")) || (err == nil && u.User != nil) {
			return true
		}
	}
	return false
}

// maskQuery is a raw query with each value replaced by "redacted", and each part without
// '=' whole.
func maskQuery(raw string) string {
	if raw == "" {
		return ""
	}
	parts := strings.Split(raw, "&")
	for i, p := range parts {
		if name, _, ok := strings.Cut(p, "="); ok {
			parts[i] = name + "=redacted"
		} else if p != "" {
			parts[i] = "redacted"
		}
	}
	return strings.Join(parts, "&")
}

// URLList is URL applied to each URL of a comma-separated list.
func URLList(list string) string {
	parts := strings.Split(list, ",")
	for i, p := range parts {
		parts[i] = URL(p)
	}
	return strings.Join(parts, ",")
}

// addressLike matches what names a place: a URL, an IP address, a host:port.
var addressLike = regexp.MustCompile(`://|\d+\.\d+\.\d+\.\d+|\[[0-9a-fA-F:]*\]|[A-Za-z0-9.-]+:\d+`)

// ErrorWords is what err says in a few words without where it came from: the innermost error's
// last words ("connection refused", "unexpected EOF", "no such host"), or "no answer" when
// those might still name an address. A status or a page anyone may read (a job's status, a dead
// letter, /readyz) shows these; the whole error goes to the log. "" for a nil err.
func ErrorWords(err error) string {
	if err == nil {
		return ""
	}
	for inner := errors.Unwrap(err); inner != nil; inner = errors.Unwrap(inner) {
		err = inner
	}
	msg := err.Error()
	if i := strings.LastIndex(msg, ": "); i >= 0 {
		msg = msg[i+len(": "):]
	}
	if msg == "" || addressLike.MatchString(msg) {
		return "no answer"
	}
	return msg
}

// addressParts are what names a place in an error's text, each with what replaces it: a
// network URL (http, https, nats, tls, ws; quoted as url.Error quotes it, or not), an IP
// address with or without a port, the host:port a socket dialled, read or wrote (Go's net errors;
// a host:port elsewhere is a job's own words, say the network rule a job was refused, and
// stays), and the name a DNS lookup looked up. A store
// URL (s3://bucket/key, file://…) names an object, as a job's status does (its manifest), not
// where the store listens: it stays.
var addressParts = []struct {
	re   *regexp.Regexp
	with string
}{
	{regexp.MustCompile(`"(?i:https?|nats|tls|wss?)://[^\s"]*"|\b(?i:https?|nats|tls|wss?)://[^\s"]*[^\s":,;.)]`), "[address]"},
	{regexp.MustCompile(`\b((?:dial|read|write) (?:tcp|udp)[46]?) [^\s:\[]+:\d{1,5}(->[^\s:]+:\d{1,5})?\b`), "$1 [address]"},
	{regexp.MustCompile(`\[[0-9A-Fa-f]*:[0-9A-Fa-f:.]*(%\w+)?\](:\d+)?`), "[address]"},
	{regexp.MustCompile(`\b\d{1,3}(\.\d{1,3}){3}(:\d+)?\b`), "[address]"},
	{regexp.MustCompile(`\blookup [^\s:]+`), "lookup [address]"},
}

// Addresses is text with every address in it (a network URL, an IP address, a socket's host:port, a
// looked-up name) replaced by "[address]": what an error recorded for others to read (a job's status,
// its manifest, a dead letter) keeps of a dependency's error. Every other word stays.
func Addresses(text string) string {
	for _, p := range addressParts {
		text = p.re.ReplaceAllString(text, p.with)
	}
	return text
}
