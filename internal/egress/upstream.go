package egress

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptrace"
	"net/url"
	"slices"
	"strconv"
	"sync/atomic"
	"time"
)

// The upstream side of terminated tunnels is one http.Transport per Proxy: connections to a
// secret-bound host are kept alive across the sandbox's connections (pip, git and curl open a new
// one per file), so a request pays one TLS handshake, the sandbox's with the proxy, rather than
// two; the Transport also drops pooled connections the server has closed before reusing them.

// tunnelKey carries a request's tunnel, and so its checked address, to dialChecked.
type tunnelKey struct{}

// errUpstreamTLS marks an upstream whose certificate did not verify.
var errUpstreamTLS = errors.New("egress: upstream TLS")

func (p *Proxy) newTransport() *http.Transport {
	return &http.Transport{
		DialTLSContext:      p.dialChecked,
		DisableCompression:  true, // pass the body as the upstream sent it
		MaxIdleConnsPerHost: 4,
		// In all, as many idle as the job may have tunnels: per host alone, a job cycling
		// through the ports or names a secret is bound to would leave one behind per tunnel.
		MaxIdleConns:           p.cfg.Limits.MaxTunnels,
		IdleConnTimeout:        90 * time.Second,
		ResponseHeaderTimeout:  p.cfg.Limits.IdleTimeout,
		MaxResponseHeaderBytes: maxResponseHeaderBytes,
		// HTTP/1.1 only: a non-nil empty map turns HTTP/2 off.
		TLSNextProto: map[string]func(string, *tls.Conn) http.RoundTripper{},
	}
}

// dialChecked opens a connection for the Transport: the tunnel's checked address, TLS verified
// for the tunnel's host against the host's roots and Config.UpstreamCAPEM.
func (p *Proxy) dialChecked(ctx context.Context, _, _ string) (net.Conn, error) {
	t, ok := ctx.Value(tunnelKey{}).(*tunnel)
	if !ok {
		return nil, errors.New("egress: a request without a checked address")
	}
	raw, v := p.dial(ctx, t.addr)
	if v != nil {
		return nil, fmt.Errorf("%w %s: %s", errDial, t.addr, v.detail)
	}
	up := tls.Client(&idleConn{Conn: raw, idle: p.cfg.Limits.IdleTimeout}, p.upstreamTLS(t.h.String()))
	hctx, cancel := context.WithTimeout(ctx, p.cfg.Limits.DialTimeout)
	defer cancel()
	if err := up.HandshakeContext(hctx); err != nil {
		raw.Close()
		return nil, fmt.Errorf("%w: %s: %v", errUpstreamTLS, t.h, err)
	}
	return up, nil
}

// outbound is the request sent upstream for one request read inside a tunnel: same method,
// path, Host and (swapped) header fields, the body streamed from the sandbox through in. Its
// header is taken from the job's byte cap whole before the Transport writes it, or the request
// is not sent (errByteCap).
//
// connected is set once the Transport has a connection for the request, dialled or pooled:
// until then nothing of it has left the proxy.
func outbound(ctx context.Context, t *tunnel, req *http.Request, out *meter, body *meteredBody, connected *atomic.Bool) (*http.Request, error) {
	ctx = httptrace.WithClientTrace(context.WithValue(ctx, tunnelKey{}, t),
		&httptrace.ClientTrace{GotConn: func(httptrace.GotConnInfo) { connected.Store(true) }})
	o := req.Clone(ctx)
	// Only the checked host and the path go upstream, never a target as the sandbox spelled
	// it: whatever would make the upstream read another host (an opaque or absolute-form
	// target, userinfo) is dropped here even if a check upstream of this one misses it.
	o.URL = &url.URL{Scheme: "https", Host: t.authority(), Path: req.URL.Path, RawPath: req.URL.RawPath,
		RawQuery: req.URL.RawQuery, ForceQuery: req.URL.ForceQuery}
	o.RequestURI = ""
	o.Host = req.Host
	o.Close = false
	// The sandbox's trailers are not sent on, and neither is the Trailer field that announces
	// them, which the Transport writes from the map's keys: their names are the sandbox's to
	// choose, up to max_header_bytes a request, and headerSize did not count them.
	o.Trailer = nil
	// An encoded body could not be scrubbed of values the server echoes (scrub.go).
	o.Header.Set("Accept-Encoding", "identity")
	if _, ok := o.Header["User-Agent"]; !ok {
		o.Header["User-Agent"] = nil // the Transport adds its own otherwise
	}
	hasBody := req.ContentLength != 0 || len(req.TransferEncoding) > 0
	if hasBody {
		body.ReadCloser, body.m, body.chunked = req.Body, out, req.ContentLength < 0
		o.Body = body
	} else {
		body.done.Store(true)
		o.Body = http.NoBody // an unknown body would make the Transport probe it
	}
	if err := out.takeAll(headerSize(o, hasBody)); err != nil {
		return nil, fmt.Errorf("request header for %s: %w", t.h, err)
	}
	return o, nil
}

// headerSize is what the Transport writes of o's header: request line, Host (the URL's when
// the request has none, as an HTTP/1.0 one may), fields, a body's framing field (counted at
// its longest, Content-Length of 19 digits; net/http sends "Content-Length: 0" for a POST,
// PUT or PATCH without a body too) and the blank line.
func headerSize(o *http.Request, hasBody bool) int {
	var fields countingWriter
	_ = o.Header.Write(&fields)
	hostField := o.Host
	if hostField == "" {
		hostField = o.URL.Host
	}
	n := len(o.Method) + len(" ") + len(o.URL.RequestURI()) + len(" HTTP/1.1\r\nHost: \r\n") + len(hostField) +
		int(fields) + len("\r\n")
	if hasBody || slices.Contains([]string{http.MethodPost, http.MethodPut, http.MethodPatch}, o.Method) {
		n += len("Content-Length: 9223372036854775807\r\n")
	}
	return n
}

// meteredBody counts a request body as the Transport writes it upstream, reading no more than
// is left under the job's byte cap, and says when it has read it whole: the body is read from
// the sandbox's connection, which nothing else may read until then. A body of unknown length
// goes upstream chunked, one chunk for each read (the Transport's chunked writer under
// io.Copy), and the sandbox decides how much a read gets: each read's framing ("%x\r\n" and
// "\r\n") and the last chunk ("0\r\n\r\n") are taken from the cap with its bytes, or a
// body sent a byte a chunk put five bytes upstream for each one counted.
type meteredBody struct {
	io.ReadCloser
	m       *meter
	chunked bool
	done    atomic.Bool // the body was read to its end
}

// lastChunk is what the Transport writes after a chunked body: the zero-length chunk and the
// empty trailer (the sandbox's trailers are not sent on).
const lastChunk = len("0\r\n\r\n")

func (b *meteredBody) Read(p []byte) (int, error) {
	if len(p) == 0 {
		return b.ReadCloser.Read(p)
	}
	k := b.m.take(len(p) + b.framing(len(p)))
	room := k
	if b.chunked {
		// The most data whose chunk fits in k: its size's digits are no more than k's.
		room = max(k-b.framing(k), 0)
	}
	if room == 0 {
		b.m.settle(k, 0)
		return 0, errByteCap
	}
	n, err := b.ReadCloser.Read(p[:room])
	if err != nil && !errors.Is(err, io.EOF) {
		err = fmt.Errorf("%w: %w", errClientBody, err)
	}
	used := n
	if n > 0 {
		used += b.framing(n)
	}
	b.m.settle(k, used)
	if errors.Is(err, io.EOF) {
		if b.chunked && b.m.takeAll(lastChunk) != nil {
			return n, errByteCap
		}
		b.done.Store(true)
	}
	return n, err
}

// framing is what the Transport writes around a chunk of n bytes: its size in hex, and two
// CRLFs. Nothing for a body of known length.
func (b *meteredBody) framing(n int) int {
	if !b.chunked {
		return 0
	}
	return len(strconv.FormatInt(int64(n), 16)) + len("\r\n\r\n")
}

type countingWriter int

func (c *countingWriter) Write(p []byte) (int, error) {
	*c += countingWriter(len(p))
	return len(p), nil
}
