package egress

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"crypto/ecdh"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"strconv"
	"strings"
	"testing"
	"time"
)

// bypass is one attempt to get past the proxy. Raw rows send bytes and read the refusal; run
// rows drive a connection themselves. Every row must end in a denied decision with want, and
// the stub dialer must have been asked for nothing.
type bypass struct {
	name  string
	raw   string
	run   func(t *testing.T, h *harness)
	tweak func(*Config)
	want  Reason
	sent  bool // a form read on its way upstream: the upstream may see its start, never its end
}

func connectReq(authority string) string {
	return "CONNECT " + authority + " HTTP/1.1\r\nHost: " + authority + "\r\n\r\n"
}

func getReq(url, hostField string, extra ...string) string {
	return "GET " + url + " HTTP/1.1\r\nHost: " + hostField + "\r\n" + strings.Join(extra, "") + "\r\n"
}

func postPlain(fields string) string {
	return "POST http://plain.example.com/ HTTP/1.1\r\nHost: plain.example.com\r\n" + fields + "\r\nhello"
}

func bypassRows() []bypass {
	rows := []bypass{
		// IP literals: normalised, so the allow entry "127.0.0.1" matches every spelling of it
		// and the address table still refuses; no name rule ever matches an address.
		{name: "CONNECT dotted loopback", raw: connectReq("127.0.0.1:443"), want: ReasonDeniedAddress},
		{name: "CONNECT decimal loopback", raw: connectReq("2130706433:443"), want: ReasonDeniedAddress},
		{name: "CONNECT octal loopback", raw: connectReq("0177.0.0.1:443"), want: ReasonDeniedAddress},
		{name: "CONNECT hex-dotted loopback", raw: connectReq("0x7f.0.0.1:443"), want: ReasonDeniedAddress},
		{name: "CONNECT hex loopback", raw: connectReq("0x7f000001:443"), want: ReasonDeniedAddress},
		{name: "CONNECT octal whole loopback", raw: connectReq("017700000001:443"), want: ReasonDeniedAddress},
		{name: "CONNECT short loopback", raw: connectReq("127.1:443"), want: ReasonDeniedAddress},
		{name: "CONNECT trailing-dot loopback", raw: connectReq("127.0.0.1.:443"), want: ReasonDeniedAddress},
		{name: "CONNECT IPv4-mapped loopback", raw: connectReq("[::ffff:127.0.0.1]:443"), want: ReasonDeniedAddress},
		// Not in the allow list, an address is refused before the address table is asked.
		{name: "CONNECT IPv4-mapped metadata, in hex", raw: connectReq("[::ffff:a9fe:a9fe]:443"), want: ReasonNotAllowed},
		{name: "CONNECT NAT64 metadata", raw: connectReq("[64:ff9b::a9fe:a9fe]:443"), want: ReasonNotAllowed},
		{name: "CONNECT IPv6 with a zone id", raw: connectReq("[fe80::1%25eth0]:443"), want: ReasonBadRequest},
		{name: "CONNECT IPv6 with a raw zone id", raw: connectReq("[fe80::1%eth0]:443"), want: ReasonBadRequest},
		{name: "CONNECT mapped address with a zone id", raw: connectReq("[::ffff:127.0.0.1%lo]:443"), want: ReasonBadRequest},
		{name: "CONNECT IPv6 unbracketed", raw: connectReq("::1:443"), want: ReasonBadRequest},
		{name: "forwarded IPv6 target with a zone id", raw: getReq("http://[fe80::1%25eth0]/", "[fe80::1%25eth0]"), want: ReasonBadRequest},
		{name: "CONNECT IPv6 loopback", raw: connectReq("[::1]:443"), want: ReasonNotAllowed},
		{name: "CONNECT long IPv6 loopback", raw: connectReq("[0:0:0:0:0:0:0:1]:443"), want: ReasonNotAllowed},
		{name: "CONNECT metadata", raw: connectReq("169.254.169.254:80"), want: ReasonNotAllowed},
		{name: "CONNECT IPv6 metadata", raw: connectReq("[fd00:ec2::254]:80"), want: ReasonNotAllowed},
		{name: "CONNECT an allowed name's address", raw: connectReq(apiAddr + ":443"), want: ReasonNotAllowed},
		{name: "CONNECT an allowed name's address, decimal", raw: connectReq("3323068426:443"), want: ReasonNotAllowed},
		{name: "CONNECT an allowed name's address, hex", raw: connectReq("0xc6.0x12.0.0xa:443"), want: ReasonNotAllowed},
		{name: "GET decimal loopback", raw: getReq("http://2130706433/", "2130706433"), want: ReasonDeniedAddress},
		{name: "GET percent-encoded loopback", raw: getReq("http://%31%32%37.0.0.1/", "127.0.0.1"), want: ReasonBadRequest},
		{name: "GET metadata", raw: getReq("http://169.254.169.254/latest/meta-data/", "169.254.169.254"), want: ReasonNotAllowed},
		{name: "GET localhost", raw: getReq("http://localhost/", "localhost"), want: ReasonNotAllowed},
		{name: "CONNECT localhost", raw: connectReq("localhost:443"), want: ReasonNotAllowed},
		// The worker's own endpoints, by name and by the address a name resolves to.
		{name: "CONNECT the NATS endpoint by name", raw: connectReq("nats.files.example.com:4222"), want: ReasonWorkerEndpoint},
		{name: "CONNECT the store endpoint's address by an allowed name", raw: connectReq("mirror.files.example.com:9000"), want: ReasonWorkerEndpoint},
		{name: "CONNECT the store endpoint by its address, allowed exactly", raw: connectReq(storeAddr + ":9000"), want: ReasonWorkerEndpoint},
		// Another port of an endpoint's host: its name and addresses are the worker's on every
		// port, unless an entry names exactly that host and port (TestWorkerEndpointHosts).
		{name: "CONNECT another port of the NATS host by name", raw: connectReq("nats.files.example.com:6222"), want: ReasonWorkerEndpoint},
		{name: "GET another port of the NATS host by name", raw: getReq("http://nats.files.example.com:8223/varz", "nats.files.example.com:8223"), want: ReasonWorkerEndpoint},
		{name: "CONNECT another port of the store's address by an allowed name", raw: connectReq("mirror.files.example.com:9001"), want: ReasonWorkerEndpoint},
		{name: "CONNECT the store's address on an exact entry's port by another name", raw: connectReq("other.files.example.com:8080"), want: ReasonWorkerEndpoint},
		// Names and ports outside the allowlist.
		{name: "CONNECT an allowed name on another port", raw: connectReq("pkg.example.com:8443"), want: ReasonNotAllowed},
		{name: "CONNECT a wildcard's apex", raw: connectReq("files.example.com:443"), want: ReasonNotAllowed},
		{name: "CONNECT an allowed name as a prefix", raw: connectReq("api.example.com.evil.test:443"), want: ReasonNotAllowed},
		{name: "CONNECT a lookalike suffix", raw: connectReq("evilfiles.example.com:443"), want: ReasonNotAllowed},
		{name: "GET an allowed name on another port", raw: getReq("http://plain.example.com:8080/", "plain.example.com:8080"), want: ReasonNotAllowed},
		{name: "CONNECT a name that does not resolve", raw: connectReq("nx.files.example.com:443"), want: ReasonResolve},
		// Host fields that disagree with the target.
		{name: "GET Host differs from target", raw: getReq("http://plain.example.com/", "lo.files.example.com"), want: ReasonHostMismatch},
		{name: "GET Host port differs from target", raw: getReq("http://plain.example.com/", "plain.example.com:81"), want: ReasonHostMismatch},
		{name: "CONNECT Host differs from target", raw: "CONNECT a.files.example.com:443 HTTP/1.1\r\nHost: lo.files.example.com:443\r\n\r\n", want: ReasonHostMismatch},
		// Request smuggling shapes.
		{name: "CL then TE", raw: postPlain("Content-Length: 5\r\nTransfer-Encoding: chunked\r\n"), want: ReasonSmuggling},
		{name: "TE then CL", raw: postPlain("Transfer-Encoding: chunked\r\nContent-Length: 5\r\n"), want: ReasonSmuggling},
		{name: "two different CL", raw: postPlain("Content-Length: 5\r\nContent-Length: 6\r\n"), want: ReasonSmuggling},
		{name: "two equal CL", raw: postPlain("Content-Length: 5\r\nContent-Length: 5\r\n"), want: ReasonSmuggling},
		{name: "TE xchunked", raw: postPlain("Transfer-Encoding: xchunked\r\n"), want: ReasonSmuggling},
		{name: "TE chunked, identity", raw: postPlain("Transfer-Encoding: chunked, identity\r\n"), want: ReasonSmuggling},
		{name: "space before colon", raw: postPlain("Transfer-Encoding : chunked\r\n"), want: ReasonSmuggling},
		{name: "folded TE", raw: postPlain("X-A: b\r\n Transfer-Encoding: chunked\r\n"), want: ReasonSmuggling},
		{name: "bare LF", raw: postPlain("X-A: b\nTransfer-Encoding: chunked\r\n"), want: ReasonSmuggling},
		{name: "CL with a sign", raw: postPlain("Content-Length: +5\r\n"), want: ReasonSmuggling},
		{name: "CL in hex", raw: postPlain("Content-Length: 0x5\r\n"), want: ReasonSmuggling},
		{name: "two TE fields", raw: postPlain("Transfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n"), want: ReasonSmuggling},
		{name: "two Host fields", raw: getReq("http://plain.example.com/", "plain.example.com", "Host: lo.files.example.com\r\n"), want: ReasonSmuggling},
		{name: "TE on HTTP/1.0", raw: "POST http://plain.example.com/ HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n", want: ReasonSmuggling},
		{name: "NUL in a value", raw: getReq("http://plain.example.com/", "plain.example.com", "X-A: a\x00b\r\n"), want: ReasonSmuggling},
		// Servers that map "_" to "-" in field names (CGI's HTTP_ variables; gunicorn before
		// 22, CVE-2024-1135) frame by a field the proxy took for any other and sent on.
		{name: "TE with an underscore", raw: postPlain("Content-Length: 5\r\nTransfer_Encoding: chunked\r\n"), want: ReasonSmuggling},
		{name: "CL with an underscore", raw: postPlain("Content-Length: 5\r\ncontent_length: 50\r\n"), want: ReasonSmuggling},
		// Malformed and unsupported.
		{name: "origin-form to the proxy", raw: getReq("/", "plain.example.com"), want: ReasonBadRequest},
		{name: "https absolute-form", raw: getReq("https://api.example.com/", "api.example.com"), want: ReasonBadRequest},
		{name: "TRACE", raw: "TRACE http://plain.example.com/ HTTP/1.1\r\nHost: plain.example.com\r\n\r\n", want: ReasonMethod},
		{name: "trace in lower case", raw: "trace http://plain.example.com/ HTTP/1.1\r\nHost: plain.example.com\r\n\r\n", want: ReasonMethod},
		{name: "connect in lower case", raw: "connect http://plain.example.com/ HTTP/1.1\r\nHost: plain.example.com\r\n\r\n", want: ReasonMethod},
		{name: "garbage request line", raw: "HELLO\r\n\r\n", want: ReasonBadRequest},
		{name: "CONNECT without a port", raw: connectReq("a.files.example.com"), want: ReasonBadRequest},
		{name: "oversize header", raw: getReq("http://plain.example.com/", "plain.example.com", "X-Big: "+strings.Repeat("a", 64<<10)+"\r\n"), want: ReasonHeaderTooLarge},
		{name: "slow client", run: slowHeader, tweak: shortHeaderTimeout, want: ReasonHeaderTimeout},
		{name: "no ClientHello after CONNECT", run: silentTunnel, tweak: shortHeaderTimeout, want: ReasonHeaderTimeout},
		{name: "SNI differs from the CONNECT host", run: tlsThrough("a.files.example.com:443", "other.example.com"), want: ReasonSNIMismatch},
		{name: "SNI of a denied name", run: tlsThrough("a.files.example.com:443", "lo.files.example.com"), want: ReasonSNIMismatch},
		{name: "no SNI for a name", run: tlsThrough("a.files.example.com:443", ""), want: ReasonSNIMismatch},
		// ECH: the outer SNI is the allowed name, the host the front answers for is encrypted.
		{name: "ECH behind an allowed name", run: echThrough("a.files.example.com:443", "a.files.example.com", "evil.example.net"), want: ReasonECH},
		{name: "ECH to the bound host", run: echThrough("api.example.com:443", "api.example.com", "evil.example.net"), want: ReasonECH},
		{name: "SSH through a tunnel", run: plainThrough("a.files.example.com:443", "SSH-2.0-OpenSSH_9.6\r\n"), want: ReasonNotTLS},
		{name: "plain HTTP through a tunnel", run: plainThrough("a.files.example.com:443", getReq("/", "a.files.example.com")), want: ReasonNotTLS},
		{name: "terminated: absolute-URI for another host", run: inside(getReq("https://other.example.com/", "api.example.com")), want: ReasonHostMismatch},
		{name: "terminated: Host of another host", run: inside(getReq("/", "other.example.com")), want: ReasonHostMismatch},
		{name: "terminated: Host with another port than the tunnel's", run: inside(getReq("/", "api.example.com:8443")), want: ReasonHostMismatch},
		{name: "terminated: absolute-URI on another port than the tunnel's", run: inside(getReq("https://api.example.com:8443/", "api.example.com:8443")), want: ReasonHostMismatch},
		{name: "terminated: CL and TE", run: inside("POST / HTTP/1.1\r\nHost: api.example.com\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n"), want: ReasonSmuggling},
		{name: "terminated: oversize header", run: inside(getReq("/", "api.example.com", "X-Big: "+strings.Repeat("a", 64<<10)+"\r\n")), want: ReasonHeaderTooLarge},
		{name: "terminated: bare LF", run: inside("GET / HTTP/1.1\r\nHost: api.example.com\nX-A: b\r\n\r\n"), want: ReasonSmuggling},
		{name: "terminated: TE with an underscore", run: inside("POST / HTTP/1.1\r\nHost: api.example.com\r\nContent-Length: 5\r\nTransfer_Encoding: chunked\r\n\r\n0\r\n\r\n"), want: ReasonSmuggling},
		{name: "terminated: the sandbox does not trust the job CA", run: untrusted("api.example.com:443"), want: ReasonClientTLS},
		{name: "terminated: CONNECT inside", run: inside(connectReq("pkg.example.com:443")), want: ReasonMethod},
		// TRACE echoes the request, swapped secret and all; servers that read methods without
		// regard to case (Werkzeug, Jetty's legacy mode) take "Trace" for it.
		{name: "terminated: Trace in mixed case", run: inside("Trace / HTTP/1.1\r\nHost: api.example.com\r\n\r\n"), want: ReasonMethod},
		// A target net/http parses as opaque (no host to check) is written upstream verbatim:
		// the bound host's server reads "http://evil..." as absolute-form, for another host.
		{name: "terminated: opaque target read upstream as absolute-form", run: inside(getReq("x:http://evil.example.net/", "api.example.com")), want: ReasonBadRequest},
		{name: "terminated: opaque https target", run: inside(getReq("https:evil.example.net", "api.example.com")), want: ReasonBadRequest},
		{name: "terminated: scheme without a host", run: inside(getReq("x:/v1", "api.example.com")), want: ReasonBadRequest},
		{name: "more tunnels than the cap", run: overTunnelCap, tweak: func(c *Config) { c.Limits.MaxTunnels = 2 }, want: ReasonTunnelCap},
	}
	for name := range deniedNames {
		rows = append(rows, bypass{name: "CONNECT " + name, raw: connectReq(name + ":443"), want: ReasonDeniedAddress})
	}
	return append(rows, overrideRows()...)
}

// overrideRows are requests that ask the server, by a method-override field or _method
// parameter, for a method the proxy refuses: Jersey's HttpMethodOverrideFilter, Symfony and
// Express's method-override take it for the request's method, and a TRACE echoes the
// request, swapped secret and all. Names in any spelling a server that folds them reads
// (foldFieldName), values in any case, in a list.
func overrideRows() []bypass {
	var rows []bypass
	for _, field := range []string{"X-HTTP-Method-Override: TRACE", "x_http_method_override: trace", "X.HTTP.Method.Override: Track",
		"X-HTTP-Method: TRACE", "X~Method~Override: CONNECT", "X-HTTP-Method-Override: GET, TRACE", "X-Method-Override:  trace "} {
		rows = append(rows,
			bypass{name: "terminated: " + field, run: inside("POST / HTTP/1.1\r\nHost: api.example.com\r\n" + field + "\r\nContent-Length: 0\r\n\r\n"), want: ReasonMethod},
			bypass{name: "forwarded: " + field, raw: postPlain(field + "\r\nContent-Length: 0\r\n"), want: ReasonMethod})
	}
	// PHP drops a name's leading spaces and reads it up to a NUL: "+_method" and "_method%00x"
	// are its "_method".
	// Past 10,000 pairs Go's ParseQuery reads none: the _method after them went upstream.
	for _, query := range []string{"_method=TRACE", "a=1&_method=trace", ".method=TRACE", "_method=%54RACE", "a=1;_method=TRACE",
		"+_method=TRACE", "%20%20.method=TRACE", "_method%00x=TRACE", "_method%00%zz=TRACE", strings.Repeat("a&", 10001) + "_method=TRACE"} {
		rows = append(rows,
			bypass{name: "terminated: ?" + shortName(query), run: inside("POST /?" + query + " HTTP/1.1\r\nHost: api.example.com\r\nContent-Length: 0\r\n\r\n"), want: ReasonMethod},
			bypass{name: "forwarded: ?" + shortName(query), raw: "POST http://plain.example.com/?" + query + " HTTP/1.1\r\nHost: plain.example.com\r\nContent-Length: 0\r\n\r\n", want: ReasonMethod})
	}
	return append(rows, formOverrideRows()...)
}

// shortName is a row's query or body, its long runs cut to their first bytes.
func shortName(s string) string {
	if len(s) > 40 {
		return fmt.Sprintf("%s...(%d bytes)...%s", s[:12], len(s), s[len(s)-16:])
	}
	return s
}

// formOverrideRows ask for a refused method by a _method in a form body (Symfony and Laravel
// read it from a POST's form as from its query), each on both paths: the proxy read the query
// alone, and the body went upstream. The form is read as it goes upstream, which gets its
// header and the body before the refused pair, and never the body's end; a parameter's name,
// or a _method's value, over the 64 KiB the proxy holds is refused.
func formOverrideRows() []bypass {
	const form = "application/x-www-form-urlencoded"
	over := "a=" + strings.Repeat("x", maxFormBytes) + "&_method=TRACE"
	gz := gzipped("_method=TRACE")
	mp := "--b\r\nContent-Disposition: form-data; name=\"_method\"\r\n\r\nTRACE\r\n--b--\r\n"
	type body struct{ name, method, ctype, fields, body string }
	bodies := []body{
		{"_method=TRACE", "POST", form, "", "_method=TRACE"},
		{"a=1&_method=trace", "POST", form, "", "a=1&_method=trace"},
		{".method=TRACE", "POST", form, "", ".method=TRACE"},
		{"+_method=TRACE", "POST", form, "", "+_method=TRACE"},
		{"_method%00=TRACE", "POST", form, "", "_method%00=TRACE"},
		{"_method%00%zz=TRACE", "POST", form, "", "_method%00%zz=TRACE"},
		{"_method=%54RACE", "POST", form, "", "_method=%54RACE"},
		{"a=1;_method=TRACE", "POST", form, "", "a=1;_method=TRACE"},
		{"_method=TRACK", "POST", form, "", "_method=TRACK"},
		{"_method=CONNECT", "POST", form, "", "_method=CONNECT"},
		{"with a charset, in any case", "POST", "Application/X-WWW-Form-URLencoded; charset=UTF-8", "", "_method=TRACE"},
		{"the type ended by a space, as PHP ends it", "POST", "application/x-www-form-urlencoded charset=UTF-8", "", "_method=TRACE"},
		{"post in lower case", "post", form, "", "_method=TRACE"},
		{"chunked", "POST", form, "Transfer-Encoding: chunked\r\n", "d\r\n_method=TRACE\r\n0\r\n\r\n"},
		{"_method=TRACE past 64 KiB of the form", "POST", form, "", over},
		{"_method=TRACE past 10,001 pairs", "POST", form, "", strings.Repeat("a&", 10001) + "_method=TRACE"},
		{"a name over 64 KiB", "POST", form, "", strings.Repeat("a", maxFormBytes+1) + "=1"},
		{"a _method's value over 64 KiB", "POST", form, "", "_method=" + strings.Repeat("x", maxFormBytes+1)},
		{"multipart", "POST", "multipart/form-data; boundary=b", "", mp},
		{"multipart, the boundary Rack reads, not PHP's", "POST", "multipart/form-data; xboundary=a; boundary=b", "", mp},
		{"multipart/mixed, bare LFs, folded", "POST", "Multipart/Mixed; boundary=b", "", "--b\nContent-Disposition: form-data;\n name=_method\n\nTRACE\n--b--\n"},
		{"multipart, after a file", "POST", "multipart/form-data; boundary=b", "",
			"--b\r\nContent-Disposition: form-data; name=\"f\"; filename=\"a\"\r\n\r\n" + strings.Repeat("a", 3*maxFormBytes) + "\r\n" + mp},
		{"gzipped", "POST", form, "Content-Encoding: gzip\r\n", gz},
		{"gzipped, the field spelled Content_Encoding", "POST", form, "Content_Encoding: gzip\r\n", gz},
	}
	var rows []bypass
	for _, b := range bodies {
		fields := "Content-Type: " + b.ctype + "\r\n" + b.fields
		if !strings.Contains(b.fields, "chunked") && !strings.Contains(b.fields, "Content-Length") {
			fields += "Content-Length: " + strconv.Itoa(len(b.body)) + "\r\n"
		}
		sent := !strings.HasPrefix(b.name, "gzipped") // refused before the dial
		rows = append(rows,
			bypass{name: "terminated: form " + b.name, run: inside(b.method + " / HTTP/1.1\r\nHost: api.example.com\r\n" + fields + "\r\n" + b.body), want: ReasonMethod, sent: sent},
			bypass{name: "forwarded: form " + b.name, raw: b.method + " http://plain.example.com/ HTTP/1.1\r\nHost: plain.example.com\r\n" + fields + "\r\n" + b.body, want: ReasonMethod, sent: sent})
	}
	return rows
}

// gzipped is s gzip-compressed.
func gzipped(s string) string {
	var b bytes.Buffer
	zw := gzip.NewWriter(&b)
	_, _ = zw.Write([]byte(s))
	_ = zw.Close()
	return b.String()
}

func TestBypass(t *testing.T) {
	rows := bypassRows()
	if len(rows) < 40 {
		t.Fatalf("%d bypass rows, want at least 40", len(rows))
	}
	for _, tt := range rows {
		t.Run(tt.name, func(t *testing.T) {
			h := setup(t, tt.tweak)
			if tt.raw != "" {
				if status, got := h.raw(t, tt.raw); got != tt.want || status < 400 {
					t.Fatalf("answer %d %q, want a refusal for %s", status, got, tt.want)
				}
			} else {
				tt.run(t, h)
			}
			d := h.waitDecision(t, "the refusal", func(d Decision) bool { return !d.Allowed })
			if d.Reason != tt.want {
				t.Errorf("decision %+v, want %s", d, tt.want)
			}
			if _, err := netip.ParseAddrPort(d.Addr); d.Addr != "" && err != nil {
				t.Errorf("decision %+v: its addr is no address", d)
			}
			if got := h.dialer.seen(); len(got) != 0 && !tt.sent {
				t.Errorf("the proxy dialled %v", got)
			}
			if n := h.tlsUp.count() + h.plainUp.count(); n != 0 {
				t.Errorf("the upstreams got %d requests", n)
			}
		})
	}
}

// untrusted opens a tunnel to the bound host with a client that does not trust the job CA.
func untrusted(authority string) func(*testing.T, *harness) {
	return func(t *testing.T, h *harness) {
		c := h.connectOK(t, authority)
		host, _, _ := net.SplitHostPort(authority)
		if err := tls.Client(c, &tls.Config{ServerName: host, RootCAs: x509.NewCertPool()}).Handshake(); err == nil {
			t.Fatal("the handshake went through")
		}
		c.Close() // the proxy reads the alert, or the close
	}
}

func shortHeaderTimeout(c *Config) { c.Limits.HeaderTimeout = 200 * time.Millisecond }

// slowHeader sends half a header and waits for the proxy to give up.
func slowHeader(t *testing.T, h *harness) {
	c := h.dialProxy(t)
	if _, err := io.WriteString(c, "GET http://plain.example.com/ HTTP/1.1\r\nHost: plain.exa"); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusRequestTimeout {
		t.Fatalf("want 408, got %d", resp.StatusCode)
	}
}

// connectOK opens a tunnel and reads the proxy's 200.
func (h *harness) connectOK(t *testing.T, authority string) net.Conn {
	t.Helper()
	c := h.dialProxy(t)
	if _, err := io.WriteString(c, connectReq(authority)); err != nil {
		t.Fatal(err)
	}
	br := bufio.NewReader(c)
	resp, err := http.ReadResponse(br, &http.Request{Method: http.MethodConnect})
	if err != nil {
		t.Fatalf("CONNECT %s: %v", authority, err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("CONNECT %s: %d", authority, resp.StatusCode)
	}
	if br.Buffered() != 0 {
		t.Fatal("bytes after the 200")
	}
	return c
}

// silentTunnel opens a tunnel and sends nothing; the proxy must close it.
func silentTunnel(t *testing.T, h *harness) {
	c := h.connectOK(t, "a.files.example.com:443")
	if _, err := io.ReadAll(c); err != nil {
		t.Fatalf("want the tunnel closed, got %v", err)
	}
}

// tlsThrough opens a tunnel to authority and starts TLS with serverName as SNI.
func tlsThrough(authority, serverName string) func(*testing.T, *harness) {
	return func(t *testing.T, h *harness) {
		c := h.connectOK(t, authority)
		tc := tls.Client(c, &tls.Config{ServerName: serverName, InsecureSkipVerify: serverName == ""})
		if err := tc.Handshake(); err == nil {
			t.Fatal("the handshake went through")
		}
	}
}

// echThrough opens a tunnel to authority and starts TLS with Encrypted Client Hello, as a
// client that has the ECH config of a front whose public name is outer: its ClientHello's SNI
// is outer, and the name it is really for, inner, is encrypted to the front's key.
func echThrough(authority, outer, inner string) func(*testing.T, *harness) {
	return func(t *testing.T, h *harness) {
		c := h.connectOK(t, authority)
		tc := tls.Client(c, &tls.Config{ServerName: inner, MinVersion: tls.VersionTLS13,
			EncryptedClientHelloConfigList: echConfigList(t, outer)})
		if err := tc.Handshake(); err == nil {
			t.Fatal("the handshake went through")
		}
	}
}

// echConfigList is an ECHConfigList (RFC 9849, section 4) with one config for publicName:
// DHKEM(X25519, HKDF-SHA256), HKDF-SHA256 and AES-128-GCM.
func echConfigList(t *testing.T, publicName string) []byte {
	t.Helper()
	key, err := ecdh.X25519().GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	u16 := func(b []byte, v int) []byte { return append(b, byte(v>>8), byte(v)) }
	pub := key.PublicKey().Bytes()
	var contents []byte
	contents = append(contents, 7)                        // config_id
	contents = u16(contents, 0x0020)                      // kem_id
	contents = append(u16(contents, len(pub)), pub...)    // public_key
	contents = u16(u16(u16(contents, 4), 0x0001), 0x0001) // cipher_suites: one, kdf_id and aead_id
	contents = append(contents, 0)                        // maximum_name_length
	contents = append(append(contents, byte(len(publicName))), publicName...)
	contents = u16(contents, 0) // extensions
	config := u16(u16(nil, 0xfe0d), len(contents))
	config = append(config, contents...)
	return append(u16(nil, len(config)), config...)
}

// plainThrough opens a tunnel and sends something that is not TLS.
func plainThrough(authority, payload string) func(*testing.T, *harness) {
	return func(t *testing.T, h *harness) {
		c := h.connectOK(t, authority)
		if _, err := io.WriteString(c, payload); err != nil {
			t.Fatal(err)
		}
		if b, _ := io.ReadAll(c); len(b) != 0 {
			t.Fatalf("got %q back", b)
		}
	}
}

// inside opens a terminated tunnel to the bound host and sends payload in it.
func inside(payload string) func(*testing.T, *harness) {
	return func(t *testing.T, h *harness) {
		c := h.connectOK(t, "api.example.com:443")
		roots := x509.NewCertPool()
		roots.AppendCertsFromPEM(h.proxy.CACertPEM())
		tc := tls.Client(c, &tls.Config{ServerName: "api.example.com", RootCAs: roots})
		if err := tc.Handshake(); err != nil {
			t.Fatalf("TLS with the job CA: %v", err)
		}
		// A refusal can come before the proxy reads everything (an oversize header): the
		// answer is still there to read when the write fails (write: broken pipe).
		_, _ = io.WriteString(tc, payload)
		resp, err := http.ReadResponse(bufio.NewReader(tc), nil)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode < 400 {
			t.Fatalf("want a refusal, got %d", resp.StatusCode)
		}
	}
}

// overTunnelCap holds two tunnels open and asks for a third.
func overTunnelCap(t *testing.T, h *harness) {
	h.connectOK(t, "a.files.example.com:443")
	h.connectOK(t, "pkg.example.com:443")
	if status, _ := h.raw(t, connectReq("a.files.example.com:443")); status != http.StatusTooManyRequests {
		t.Fatalf("third tunnel: %d, want 429", status)
	}
}
