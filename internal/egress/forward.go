package egress

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"net/textproto"
	"net/url"
	"strconv"
	"strings"
	"time"
)

// forward handles one plain-HTTP request in absolute form ("GET http://host/path"). It reports
// whether the client connection may carry another request.
func (p *Proxy) forward(ctx context.Context, c net.Conn, hd *head, req *http.Request, start time.Time) bool {
	d := Decision{Time: start, Method: req.Method}
	up, swaps, v := p.openPlain(ctx, c, hd, req, &d)
	if v != nil {
		p.refuseConn(c, d, v)
		p.lingerClose(c)
		return false
	}
	defer up.Close()
	stop := p.afterFunc(ctx, "upstream's close", func() { up.Close() })
	defer stop()
	d.Reason = ReasonAllowed
	iup := &idleConn{Conn: up, idle: p.cfg.Limits.IdleTimeout}
	lim := &io.LimitedReader{R: iup, N: maxResponseHeaderBytes}
	return p.roundTrip(ctx, c, iup, lim, req, &d, swaps)
}

// maxResponseHeaderBytes bounds an upstream's response header, on forwarded requests and in
// terminated tunnels alike: the proxy holds it whole before the byte cap counts a byte of it.
const maxResponseHeaderBytes = 1 << 20

// openPlain checks a forwarded request and dials its checked address. It returns the values
// the host's answer is scrubbed of (heldFor): those of the secrets bound to the host on any
// port, and to any host at the address. A host keeps what it got on a terminated tunnel (a
// request log, a stored field) and may serve it back on plain http://, under any of its
// names: passed on unscrubbed, the value reached the sandbox
// (TestStoredEchoOverPlainHTTPIsScrubbed, TestStoredEchoIsScrubbedUnderEveryName).
func (p *Proxy) openPlain(ctx context.Context, c net.Conn, hd *head, req *http.Request, d *Decision) (net.Conn, []swap, *verdict) {
	h, port, v := plainTarget(hd, req)
	if v != nil {
		return nil, nil, v
	}
	d.Host, d.Port = h.String(), port
	req.Host = h.hostField(port, 80)
	if v := p.admit(); v != nil {
		return nil, nil, v
	}
	addr, v := p.checkTarget(ctx, h, port)
	if v != nil {
		return nil, nil, v
	}
	d.Addr = addr.String()
	if v := checkForm(req); v != nil {
		return nil, nil, v
	}
	swaps := tunnelSwaps(p.heldFor(ctx, h, addr.Addr()))
	up, v := p.dial(ctx, addr)
	return up, swaps, v
}

// plainTarget checks a forwarded request's target and Host field.
func plainTarget(hd *head, req *http.Request) (host, int, *verdict) {
	if v := checkMethod(req); v != nil {
		return host{}, 0, v
	}
	if req.URL.Scheme != "http" || req.URL.Host == "" {
		return host{}, 0, refuse(ReasonBadRequest, "a proxied request needs an absolute http:// target; https goes through CONNECT")
	}
	h, port, err := splitHostPort(req.URL.Host, 80)
	if err != nil {
		return host{}, 0, refuse(ReasonBadRequest, "target host is not a name or an address")
	}
	if v := sameHost(hd.host, h, port, 80); v != nil {
		return host{}, 0, v
	}
	return h, port, nil
}

// sameHost refuses a Host field that names another host or port than the target.
func sameHost(field string, h host, port, defaultPort int) *verdict {
	if field == "" {
		return nil
	}
	fh, fp, err := splitHostPort(field, defaultPort)
	if err != nil || fh != h || fp != port {
		return refuse(ReasonHostMismatch, "the Host field names another host than the target")
	}
	return nil
}

// checkMethod refuses the methods the proxy does not forward (refusedMethod), and a request
// that asks the server for one by a method-override field or a _method parameter
// (checkOverride).
func checkMethod(req *http.Request) *verdict {
	if no := refusedMethod(req.Method); no != "" {
		return refuse(ReasonMethod, no+" is not forwarded")
	}
	return checkOverride(req)
}

// refusedMethod is the method the proxy does not forward that m names, in any case, or "":
// methods are case-sensitive, but servers that upper-case them (Werkzeug, Jetty's legacy
// mode) would take "trace" for TRACE and echo the request, swapped secret and all.
func refusedMethod(m string) string {
	m = strings.Trim(m, " \t")
	for _, no := range []string{http.MethodConnect, http.MethodTrace, "TRACK"} {
		if strings.EqualFold(m, no) {
			return no
		}
	}
	return ""
}

// overrideFields are the fields, folded (foldFieldName), that frameworks read as the
// request's method in place of its own: Jersey's HttpMethodOverrideFilter, Symfony, Express's
// method-override, OData's X-HTTP-Method.
var overrideFields = map[string]bool{"x-http-method-override": true, "x-http-method": true, "x-method-override": true}

// checkOverride refuses a request whose method-override field, in any spelling a server that
// folds names reads (foldFieldName), or whose _method query parameter (Symfony and Laravel
// read it; PHP reads ".method" as "_method"), names a method the proxy does not forward, any
// item of a list: a server that takes it asks its framework for a TRACE, which echoes the
// request with the secret swapped in. Other overrides go on (Google's APIs take a PATCH as
// a POST so), so a request means what its sender meant, or is refused and says why; taken
// off, a POST asking for a DELETE would have run as the POST. A _method in a form body is
// read once the request is allowed (checkForm).
func checkOverride(req *http.Request) *verdict {
	var asked []string
	for name, vals := range req.Header {
		if overrideFields[foldFieldName(name)] {
			asked = append(asked, vals...)
		}
	}
	return refuseOverride(append(asked, methodParams(req.URL.RawQuery)...))
}

// methodParams are the values of the _method parameters of a query or a form body, names
// read as PHP reads them (php_register_variable_ex): without their leading spaces, up to a
// NUL, with ".method" or " method" as "_method" (folded: "+_method" and "_method%00x" went
// upstream, TestBypass's rows). ";" separates parameters too for some servers (Python's
// parse_qs before 3.9.2, Rack before 2). Pairs are read one by one, as a server reads as far
// as it can: Go's ParseQuery skips a pair holding a ";", and reads nothing of a query of more
// than 10,000 pairs, so "?a&a&...&_method=TRACE" went upstream (TestBypass's "10,001 pairs"
// rows).
func methodParams(raw string) []string {
	var asked []string
	for pair := range strings.FieldsFuncSeq(raw, func(r rune) bool { return r == '&' || r == ';' }) {
		name, value, _ := strings.Cut(pair, "=")
		if !overrideName(name) {
			continue
		}
		asked = append(asked, phpUnescape(value))
	}
	return asked
}

// overrideName reports whether a parameter's name, as sent, is one PHP reads as "_method".
func overrideName(raw string) bool {
	k, _, _ := strings.Cut(strings.TrimLeft(phpUnescape(raw), " "), "\x00")
	return foldFieldName(k) == "-method"
}

// phpUnescape decodes a form's name or value as PHP does (php_url_decode): "+" is a space, a
// "%" and two hex digits the byte they spell, and any other "%" itself. Go's QueryUnescape
// fails on "%zz", and the pair was skipped, where PHP read "_method%00%zz" as "_method"
// (TestBypass's "_method%00%zz" rows: 200 on both paths).
func phpUnescape(s string) string {
	if v, err := url.QueryUnescape(s); err == nil {
		return v
	}
	b := make([]byte, 0, len(s))
	for i := 0; i < len(s); i++ {
		switch {
		case s[i] == '+':
			b = append(b, ' ')
		case s[i] == '%' && i+2 < len(s) && isHex(s[i+1]) && isHex(s[i+2]):
			v, _ := strconv.ParseUint(s[i+1:i+3], 16, 8)
			b, i = append(b, byte(v)), i+2
		default:
			b = append(b, s[i])
		}
	}
	return string(b)
}

func isHex(c byte) bool {
	return '0' <= c && c <= '9' || 'a' <= c && c <= 'f' || 'A' <= c && c <= 'F'
}

// refuseOverride refuses asked, the methods a request asks the server for, when one names a
// method the proxy does not forward, any item of a list.
func refuseOverride(asked []string) *verdict {
	for _, v := range asked {
		for _, m := range strings.Split(v, ",") {
			if no := refusedMethod(m); no != "" {
				return refuse(ReasonMethod, "a method override names "+no+", which is not forwarded")
			}
		}
	}
	return nil
}

// checkForm refuses a POST whose form body (application/x-www-form-urlencoded) names a
// refused method in a _method parameter, as checkOverride refuses one in the query: Symfony
// and Laravel read a POST's form for it as for its query, and the proxy read the query alone
// (TestBypass's form rows). The body is read as it goes upstream (formBody), so a form of any
// size goes on (an AWS Query call: SQS and SNS take 256 KiB, SES's SendRawEmail 10 MB), and
// one naming a refused method is cut before its end, its connection closed, and refused. A
// multipart body's _method part is read so too (multipartBody): PHP and Rack read it as a
// form's (TestBypass's multipart rows).
func checkForm(req *http.Request) *verdict {
	form, multipart := isFormPost(req), isMultipartPost(req)
	if !form && !multipart {
		return nil
	}
	if !identityCoded(req.Header) {
		// A server that decodes request bodies (Apache's DEFLATE input filter) reads the form
		// the proxy cannot; no client compresses one.
		return refuse(ReasonMethod, "a form body with a Content-Encoding: the proxy reads a form's _method as it is sent; send it unencoded")
	}
	if form {
		req.Body = &formBody{ReadCloser: req.Body}
	} else {
		req.Body = &multipartBody{ReadCloser: req.Body}
	}
	return nil
}

// identityCoded reports whether h has no Content-Encoding but identity, in any spelling a
// server that folds names reads (foldFieldName).
func identityCoded(h http.Header) bool {
	for name, vals := range h {
		if foldFieldName(name) != "content-encoding" {
			continue
		}
		for _, v := range vals {
			for _, c := range strings.Split(v, ",") {
				if c = strings.TrimSpace(c); c != "" && !strings.EqualFold(c, "identity") {
					return false
				}
			}
		}
	}
	return true
}

// isFormPost reports whether req is a POST (in any case: servers that upper-case methods read
// "post" as POST) with a body whose type, any of its Content-Type fields, is a URL-encoded
// form, read as PHP reads it (sapi_read_post_data): up to a ";", "," or " ", in any case.
// Read up to the ";" alone, "application/x-www-form-urlencoded charset=UTF-8" was no form to
// the proxy and PHP's form (TestBypass's form row "the type ended by a space").
func isFormPost(req *http.Request) bool {
	return isPostOf(req, func(media string) bool { return strings.EqualFold(media, "application/x-www-form-urlencoded") })
}

// isMultipartPost reports whether req is a POST, as isFormPost reads one, with a multipart
// body of any type: PHP reads multipart/form-data's parts into its form, and Rack, so Rails,
// multipart/mixed's and /related's too (multipartBody).
func isMultipartPost(req *http.Request) bool {
	return isPostOf(req, func(media string) bool {
		return len(media) >= len("multipart/") && strings.EqualFold(media[:len("multipart/")], "multipart/")
	})
}

// isPostOf reports whether req is a POST with a body whose type, any of its Content-Type
// fields read as isFormPost says, is one of is.
func isPostOf(req *http.Request, is func(media string) bool) bool {
	if !strings.EqualFold(strings.Trim(req.Method, " \t"), http.MethodPost) || req.Body == nil || req.Body == http.NoBody {
		return false
	}
	for _, ct := range req.Header.Values("Content-Type") {
		media := strings.TrimSpace(ct)
		if i := strings.IndexAny(media, "; ,"); i >= 0 {
			media = media[:i]
		}
		if is(strings.TrimSpace(media)) {
			return true
		}
	}
	return false
}

// hopHeaders are the hop-by-hop fields a proxy must not pass on (RFC 9110 7.6.1), and the
// Upgrade the proxy does not carry.
var hopHeaders = []string{"Connection", "Proxy-Connection", "Keep-Alive", "Proxy-Authenticate",
	"Proxy-Authorization", "Te", "Trailer", "Transfer-Encoding", "Upgrade"}

// forwardingFields are the fields a front end reads as what a proxy before it saw: the
// client's address, and the host, scheme, port and path it asked for. The proxy is the last
// hop an upstream sees, sets none of them, and sends none of the sandbox's: a front end that
// routes or authorises by them (X-Forwarded-Host to pick a site, X-Forwarded-For or
// X-Real-IP to trust a client on an internal address, X-Original-URL to rewrite the path)
// would take the sandbox's word for another site or another client, a swapped secret with it.
// Names are compared folded (foldFieldName), as servers that take "_", "." or any other
// character but a letter or digit for "-" read them.
var forwardingFields = map[string]bool{
	"forwarded": true, "x-real-ip": true, "true-client-ip": true, "x-client-ip": true,
	"x-cluster-client-ip": true, "cf-connecting-ip": true, "cf-connecting-ipv6": true,
	"fastly-client-ip": true, "x-originating-ip": true, "x-remote-ip": true, "x-remote-addr": true,
	"client-ip": true, "x-host": true, "x-original-host": true, "x-http-host-override": true,
	"x-original-url": true, "x-original-uri": true, "x-rewrite-url": true, "x-original-forwarded-for": true,
	"front-end-https": true, "x-scheme": true, "x-url-scheme": true,
}

// isForwardingField reports whether a field's name is one of forwardingFields, names what a
// proxy forwarded (X-Forwarded-For, -Host, -Proto, -Port, -Prefix, -Server, -User ...), or
// is one of Envoy's, which a sidecar takes from a client it deems internal, as it may the
// worker: x-envoy-original-dst-host picks the address it dials, x-envoy-max-retries sends a
// request again, past the job's count of what it sent.
func isForwardingField(name string) bool {
	f := foldFieldName(name)
	return forwardingFields[f] || strings.HasPrefix(f, "x-forwarded") || strings.HasPrefix(f, "x-envoy-")
}

// foldFieldName is a field's name in lower case with every character but a letter or digit
// read as "-": CGI names a field HTTP_ and its name with "-" as "_" (gunicorn before 22 read
// "_" back as "-"), and lighttpd's CGI, FastCGI and SCGI write "_" for every such character,
// so PHP behind it reads "X~Real~IP" as X-Real-IP.
func foldFieldName(name string) string {
	return strings.Map(func(r rune) rune {
		switch {
		case r >= 'a' && r <= 'z', r >= '0' && r <= '9':
			return r
		case r >= 'A' && r <= 'Z':
			return r + 'a' - 'A'
		}
		return '-'
	}, name)
}

// stripRequest takes off a request's header what the upstream must not get from the
// sandbox, the hop-by-hop fields and the forwarding ones, and what net/http would not send:
// a User-Agent past the first (it writes one). It runs before placeholders are swapped, so a
// secret counts as used only in a field that goes upstream.
func stripRequest(h http.Header) {
	stripHop(h)
	for name := range h {
		if isForwardingField(name) {
			delete(h, name)
		}
	}
	if ua := h["User-Agent"]; len(ua) > 1 {
		h["User-Agent"] = ua[:1]
	}
}

// askWhole asks for an answer the scrubber can read: uncompressed, and whole. It takes off
// every field a server that folds names (foldFieldName) reads as Accept-Encoding beside the
// proxy's identity (the sandbox's Accept_Encoding: gzip went on, and such a server compressed
// a value past the scrubber: TestStoredEchoIsAskedForUncompressed), and every Range and
// If-Range: a piece shorter than a value is not the value, so a stored one read back a few
// bytes at a time came through in clear (TestStoredEchoIsReadWhole). Resumed downloads from
// a host whose answers are scrubbed start again from the first byte.
func askWhole(h http.Header) {
	for name := range h {
		switch foldFieldName(name) {
		case "accept-encoding", "range", "if-range":
			delete(h, name)
		}
	}
	h.Set("Accept-Encoding", "identity")
}

func stripHop(h http.Header) {
	for _, f := range h.Values("Connection") {
		for _, name := range strings.Split(f, ",") {
			h.Del(textproto.TrimString(name))
		}
	}
	for _, name := range hopHeaders {
		h.Del(name)
	}
}

// roundTrip sends req on the upstream connection, streams the response back to the client,
// scrubbed of swaps' values when it has any, and settles the decision. It reports whether both sides may carry another request.
func (p *Proxy) roundTrip(ctx context.Context, c net.Conn, up io.Writer, lim *io.LimitedReader, req *http.Request, d *Decision, swaps []swap) bool {
	client := sandboxConn{c}
	out := p.meter()
	in := p.meter()
	keep := !req.Close
	stripRequest(req.Header)
	// The sandbox's trailers are not sent on, as from a terminated tunnel (outbound): a server
	// that merges them into the header reads a forwarding field there that stripRequest took
	// off the header. Nil before the write, the body's trailers are read and go nowhere.
	req.Trailer = nil
	req.Close = false
	body := &clientBody{ReadCloser: req.Body}
	if req.Body != http.NoBody { // a body of no length stays NoBody: wrapped, it would go chunked
		req.Body = body
	}
	if len(swaps) > 0 {
		askWhole(req.Header)
	}
	err := continue100(client, req, in)
	if err == nil {
		uw := &keptErrWriter{w: meteredWriter{up, out}}
		err = req.Write(uw)
		if uw.err != nil {
			err = uw.err // req.Write hides it in a type errors.Is does not see through, as a body's
		}
	}
	var resp *http.Response
	if err == nil {
		resp, err = readResponse(bufio.NewReader(lim), req)
		if err != nil && lim.N <= 0 {
			err = fmt.Errorf("%w: %w", errResponseHeaderTooLarge, err)
		}
		lim.N = math.MaxInt64 // the header is in: the body is metered, not bounded
	}
	if body.err != nil {
		err = body.err // req.Write hides it in a type errors.Is does not see through
	}
	if err != nil {
		// No response: the failure is the decision (outcomes), not an allowed request.
		d.BytesOut, d.BytesIn = out.n.Load(), d.BytesIn+in.n.Load()
		p.refuseConn(client, *d, outcome(jobEnded(ctx, err), false))
		if uc, ok := up.(io.Closer); ok {
			_ = uc.Close() // cut now, not once the sandbox is done (lingerClose)
		}
		p.lingerClose(c)
		return false
	}
	keep = keep && !resp.Close
	stripHop(resp.Header)
	if len(swaps) > 0 {
		scrubResponse(resp, swaps)
	}
	resp.Close = !keep
	d.Status = resp.StatusCode
	err = resp.Write(meteredWriter{client, in})
	resp.Body.Close()
	return p.settle(d, out, in, jobEnded(ctx, err)) && keep
}

// keptErrWriter keeps the error of the write that failed.
type keptErrWriter struct {
	w   io.Writer
	err error
}

func (k *keptErrWriter) Write(b []byte) (int, error) {
	n, err := k.w.Write(b)
	if err != nil && k.err == nil {
		k.err = err
	}
	return n, err
}

// clientBody keeps a failure to read the request's body from the sandbox (errClientBody), so
// that it is not taken for the upstream's.
type clientBody struct {
	io.ReadCloser
	err error
}

func (b *clientBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	if err != nil && !errors.Is(err, io.EOF) {
		err = fmt.Errorf("%w: %w", errClientBody, err)
		b.err = err
	}
	return n, err
}

// continue100 answers a request's "Expect: 100-continue" itself, counted in in, and takes
// the field off: the body is then sent upstream whole, and the client waits for nothing.
func continue100(client io.Writer, req *http.Request, in *meter) error {
	if !strings.EqualFold(req.Header.Get("Expect"), "100-continue") {
		return nil
	}
	req.Header.Del("Expect")
	return in.writeWhole(client, "HTTP/1.1 100 Continue\r\n\r\n")
}

// settle records a request's decision once its response is through, or was cut (outcomes).
func (p *Proxy) settle(d *Decision, out, in *meter, err error) bool {
	d.BytesOut, d.BytesIn, d.Duration = out.n.Load(), d.BytesIn+in.n.Load(), time.Since(d.Time)
	settleOutcome(d, err, true)
	p.decide(*d)
	return err == nil
}

// readResponse reads the final response, skipping interim 1xx ones (100-continue was answered).
func readResponse(br *bufio.Reader, req *http.Request) (*http.Response, error) {
	for {
		resp, err := http.ReadResponse(br, req)
		if err != nil {
			return nil, err
		}
		if resp.StatusCode >= 200 || resp.StatusCode == http.StatusSwitchingProtocols {
			return notSwitched(resp, nil)
		}
		resp.Body.Close()
	}
}

// errSwitchedProtocols is an upstream's 101: the proxy carries HTTP/1.1 and no protocol after
// it (the request's Upgrade is never sent on), so it is a bad_response on every path.
var errSwitchedProtocols = errors.New("egress: upstream switched protocols, which the proxy does not carry")

// notSwitched refuses, and closes, a response that switches protocols. In a terminated tunnel
// the Transport hands a 101's connection over as its body: relayed, the upstream's next bytes
// went to the sandbox as the answer of an allowed request until idle_timeout.
func notSwitched(resp *http.Response, err error) (*http.Response, error) {
	if err == nil && resp.StatusCode == http.StatusSwitchingProtocols {
		resp.Body.Close()
		return nil, errSwitchedProtocols
	}
	return resp, err
}
