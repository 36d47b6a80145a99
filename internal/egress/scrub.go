package egress

import (
	"bytes"
	"io"
	"net/http"
	"slices"
	"strings"
)

// The proxy puts a secret's value wherever the sandbox put its placeholder in a request's
// header fields, and servers hand request fields back: a request id, a CORS Origin, an error
// message quoting its input, a stored field read back later. So the answer of a terminated
// tunnel is scrubbed on its way to the sandbox: every value the tunnel's secrets could have
// put upstream becomes its placeholder again, in header fields, the body and trailers. A
// placeholder has its value's length, so lengths and framing stay as they are. The body is
// asked for uncompressed (outbound) so it can be read; a value the server re-encodes (JSON
// escapes, URL encoding) is beyond this: bind secrets to hosts that do not echo.

// swap is one value the proxy may have put upstream and what the sandbox sees in its place.
type swap struct{ real, ph []byte }

// tunnelSwaps are the raw values of a tunnel's secrets.
func tunnelSwaps(secrets []*secret) []swap {
	out := make([]swap, 0, len(secrets))
	for _, s := range secrets {
		out = append(out, swap{real: []byte(s.value), ph: []byte(s.placeholder)})
	}
	return out
}

// scrubResponse puts placeholders back in the answer's header fields now, and in its body and
// trailers as they are read.
func scrubResponse(resp *http.Response, swaps []swap) {
	swaps = longestFirst(swaps)
	resp.Status = string(scrubBytes([]byte(resp.Status), swaps)) // the reason phrase is the server's
	scrubHeader(resp.Header, swaps)
	resp.Body = &scrubBody{ReadCloser: resp.Body, swaps: swaps, done: func() { scrubHeader(resp.Trailer, swaps) }}
}

func scrubHeader(h http.Header, swaps []swap) {
	for _, vals := range h {
		for i, v := range vals {
			vals[i] = string(scrubBytes([]byte(v), swaps))
		}
	}
}

// longestFirst orders swaps for scrubBytes: a value inside another (a password that is part
// of a token) replaced first would leave the rest of the longer one in clear around its
// placeholder.
func longestFirst(swaps []swap) []swap {
	out := slices.Clone(swaps)
	slices.SortStableFunc(out, func(a, b swap) int { return len(b.real) - len(a.real) })
	return out
}

// scrubBytes replaces every real value in b with its placeholder, in place (same lengths),
// in the order of swaps (longestFirst).
func scrubBytes(b []byte, swaps []swap) []byte { return scrubBefore(b, len(b), swaps) }

// scrubBefore is scrubBytes for the values that begin before limit.
func scrubBefore(b []byte, limit int, swaps []swap) []byte {
	for _, s := range swaps {
		if len(s.real) == 0 {
			continue // would match everywhere, and never move on
		}
		for i := 0; i < limit; {
			j := bytes.Index(b[i:], s.real)
			if j < 0 || i+j >= limit {
				break
			}
			copy(b[i+j:], s.ph)
			i += j + len(s.ph)
		}
	}
	return b
}

// scrubBody scrubs a body as it streams. It holds back the stream's last bytes, as many as the
// longest value less one, until more comes or the stream ends (a value cut across two reads is
// whole in what it scrubs next), and calls done at the end, when the trailers are in. What it
// holds depends on lengths alone, never on what the bytes are: a hold that began where a value
// began (the tail that is a prefix of one) would tell a sandbox whose chosen bytes a bound host
// streams back which of its guesses starts the real value, a character at a time.
type scrubBody struct {
	io.ReadCloser
	swaps   []swap
	done    func()
	buf     []byte // one read from upstream
	pending []byte // not yet handed out; scrubbed but for the values that begin in the hold
	held    int    // the tail of pending kept until more comes
	err     error
}

func (b *scrubBody) Read(p []byte) (int, error) {
	for len(b.pending)-b.held == 0 && b.err == nil {
		b.fill()
	}
	ready := len(b.pending) - b.held
	if ready == 0 {
		return 0, b.err
	}
	n := copy(p, b.pending[:ready])
	b.pending = b.pending[n:]
	return n, nil
}

// fill reads once more from the upstream's body and scrubs what is held with it.
func (b *scrubBody) fill() {
	if b.buf == nil {
		b.buf = make([]byte, 32<<10)
	}
	n, err := b.ReadCloser.Read(b.buf)
	b.pending = append(b.pending, b.buf[:n]...)
	b.held = 0
	if err == nil {
		b.held = min(len(b.pending), heldLen(b.swaps))
	}
	// Only the values that begin in what goes out now: each is whole already, the hold being
	// as long as the longest less one. One that begins in the hold may be the start of a longer
	// one (a password inside a token) that the next read completes; it is scrubbed then.
	b.pending = scrubBefore(b.pending, len(b.pending)-b.held, b.swaps)
	if err != nil {
		b.err = err
		if b.done != nil {
			b.done()
		}
	}
}

// heldLen is how many bytes of a stream's end scrubBody keeps until more comes: the longest
// value less one, the most of a value a read can end in without holding it whole.
func heldLen(swaps []swap) int {
	n := 0
	for _, s := range swaps {
		n = max(n, len(s.real)-1)
	}
	return n
}

// basicSwaps are the Basic credentials a request went upstream with that hold a value,
// encoded, with the encoding the sandbox sent: a server echoing the field hands back the
// encoded form, which the raw values do not match.
func basicSwaps(sent, upstream http.Header) []swap {
	var out []swap
	for k, vals := range upstream {
		for i, v := range vals {
			scheme, cred, ok := strings.Cut(v, " ")
			if !ok || !strings.EqualFold(scheme, "Basic") || i >= len(sent[k]) || sent[k][i] == v {
				continue
			}
			// swapValue sends the scheme, one space and the re-encoded credentials; the
			// sandbox's encoding is as long (a placeholder is as long as its value).
			if _, before, ok := strings.Cut(sent[k][i], " "); ok && len(strings.TrimSpace(before)) == len(cred) {
				out = append(out, swap{real: []byte(cred), ph: []byte(strings.TrimSpace(before))})
			}
		}
	}
	return out
}
