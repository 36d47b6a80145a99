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
// placeholder has its value's length, so lengths and framing stay as they are. A value is
// found in the forms servers write it in (encode.go: JSON escapes, percent-encoding, HTML
// references; its base64 inside a longer run) and replaced by its placeholder in the same form. The body is asked for
// uncompressed and whole (askWhole) so it can be read.

// swap is one value the proxy may have put upstream and what the sandbox sees in its place.
// asIs: the value is looked for as it is, in none of the encodings' forms (a base64 core).
type swap struct {
	real, ph []byte
	asIs     bool
}

// tunnelSwaps are the values of a tunnel's secrets, and their base64 cores.
func tunnelSwaps(secrets []*secret) []swap {
	out := make([]swap, 0, len(secrets)*(1+3*len(base64Encodings)))
	for _, s := range secrets {
		sw := swap{real: []byte(s.value), ph: []byte(s.placeholder)}
		out = append(append(out, sw), base64Swaps(sw)...)
	}
	return out
}

// scrubResponse puts placeholders back in the answer's header fields now, and in its body and
// trailers as they are read.
func scrubResponse(resp *http.Response, swaps []swap) {
	pats, names := compileAll(swaps), namePatterns(swaps)
	resp.Status = string(scrubBytes([]byte(resp.Status), pats)) // the reason phrase is the server's
	scrubHeader(resp.Header, names, pats)
	scrubHeader(resp.Trailer, names, pats) // the names announced before the body, in its Trailer field
	resp.Body = newScrubBody(resp.Body, pats, func() { scrubHeader(resp.Trailer, names, pats) })
}

// compileAll compiles swaps longest last, for overlay: where two values share bytes (one
// inside the other, or the tail of one the head of the other), the longer one's placeholder
// is written last, so a value inside another reads as the longer one's placeholder whole.
func compileAll(swaps []swap) []*pattern {
	swaps = slices.Clone(swaps)
	slices.SortStableFunc(swaps, func(a, b swap) int { return len(a.real) - len(b.real) })
	pats := make([]*pattern, 0, len(swaps))
	for _, s := range swaps {
		if len(s.real) > 0 { // would match everywhere
			pats = append(pats, compile(s))
		}
	}
	return pats
}

// scrubHeader scrubs each field's values, and drops a field whose name holds a value (an echo
// that makes a field of what it got): the Transport gives a name its canonical case
// ("X-Abcdef0123-Tok"), in which the value matches in no case of its own, so it is looked for
// in any case (and in any form: "%" is a name's character), and a placeholder written there
// would be cased again on the way out.
func scrubHeader(h http.Header, names, pats []*pattern) {
	for k, vals := range h {
		if namedByValue(k, names) {
			delete(h, k)
			continue
		}
		for i, v := range vals {
			vals[i] = string(scrubBytes([]byte(v), pats))
		}
	}
}

// namePatterns are the values in lower case, to look for in a field's name in lower case.
func namePatterns(swaps []swap) []*pattern {
	lower := make([]swap, len(swaps))
	for i, s := range swaps {
		v := bytes.ToLower(s.real)
		lower[i] = swap{real: v, ph: v}
	}
	return compileAll(lower)
}

// namedByValue reports whether a field's name holds one of the values, in any letters' case.
func namedByValue(name string, names []*pattern) bool {
	lower := bytes.ToLower([]byte(name))
	for _, p := range names {
		if p.matches(lower) {
			return true
		}
	}
	return false
}

// scrubBytes is b with every value of pats that occurs in it, in any of its forms,
// overwritten by its placeholder in that form (same lengths).
func scrubBytes(b []byte, pats []*pattern) []byte {
	out := slices.Clone(b)
	overlay(out, b, len(b), pats)
	return out
}

// overlay writes each value's placeholder into out wherever the value begins in raw before
// limit (out is raw's copy, with placeholders written so far). Values are looked for in raw,
// the bytes as the upstream sent them, never in what a placeholder already replaced, and each
// occurrence counts, overlapping ones too: so every byte of every occurrence becomes a
// placeholder byte. Looking in what the last replacement left would hide a value that shares
// bytes with one replaced first ("abcXYZ" and "XYZdef" in "abcXYZdef"), and its rest would
// reach the sandbox in clear.
func overlay(out, raw []byte, limit int, pats []*pattern) {
	for _, p := range pats {
		p.overlay(out, raw, limit)
	}
}

// scrubBody scrubs a body as it streams. It holds back the stream's last bytes, as many as the
// longest value's longest form less one, until more comes or the stream ends (a value cut across two reads is
// whole in what it scrubs next), and calls done at the end, when the trailers are in. What it
// holds depends on lengths alone, never on what the bytes are: a hold that began where a value
// began (the tail that is a prefix of one) would tell a sandbox whose chosen bytes a bound host
// streams back which of its guesses starts the real value, a character at a time. It keeps as
// many of the bytes it handed out, as the upstream sent them: a value that begins there and
// reaches into what it hands out next is found again, so each byte goes out as scrubBytes of
// the whole body would have it, however the upstream cut the body.
type scrubBody struct {
	io.ReadCloser
	pats  []*pattern
	hold  int
	done  func()
	buf   []byte // one read from upstream
	raw   []byte // as the upstream sent it: the last bytes handed out, then the rest
	out   []byte // raw scrubbed of the values that begin before ready
	next  int    // the first byte of raw not handed out
	ready int    // where the hold begins
	err   error
}

func newScrubBody(rc io.ReadCloser, pats []*pattern, done func()) *scrubBody {
	return &scrubBody{ReadCloser: rc, pats: pats, hold: heldLen(pats), done: done}
}

func (b *scrubBody) Read(p []byte) (int, error) {
	for b.next == b.ready && b.err == nil {
		b.fill()
	}
	if b.next == b.ready {
		return 0, b.err
	}
	n := copy(p, b.out[b.next:b.ready])
	b.next += n
	return n, nil
}

// fill reads once more from the upstream's body and scrubs what is held with it.
func (b *scrubBody) fill() {
	if b.buf == nil {
		b.buf = make([]byte, 32<<10)
	}
	hold := b.hold
	if drop := b.next - hold; drop > 0 { // no value reaching past them begins there
		b.raw = append(b.raw[:0], b.raw[drop:]...)
		b.next -= drop
	}
	n, err := b.ReadCloser.Read(b.buf)
	b.raw = append(b.raw, b.buf[:n]...)
	if err != nil {
		hold = 0
	}
	b.ready = len(b.raw) - min(len(b.raw)-b.next, hold)
	// Only the values that begin before the hold: each is whole already, the hold being as
	// long as the longest form less one. One that begins in the hold may be the start of a longer
	// one (a password inside a token) that the next read completes; it is looked for then.
	b.out = append(b.out[:0], b.raw...)
	overlay(b.out, b.raw, b.ready, b.pats)
	if err != nil {
		b.err = err
		if b.done != nil {
			b.done()
		}
	}
}

// heldLen is how many bytes of a stream's end scrubBody keeps until more comes: the longest
// form of the longest value less one, the most of a value a read can end in without holding
// it whole. It depends on lengths and on which characters the value has besides letters and
// digits, which its placeholder shows the sandbox too.
func heldLen(pats []*pattern) int {
	n := 0
	for _, p := range pats {
		n = max(n, p.span-1)
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
