package egress

import (
	"bytes"
	"encoding/base64"
	"fmt"
	"strings"
	"unicode/utf8"
)

// A bound host rarely echoes a value as it got it when the value has punctuation: PHP's
// json_encode writes "/" as "\/", Go's and .NET's encoders write "<>&" (.NET "+" too) as
// "\u003c" or "\u002B", Python's and PHP's every non-ASCII character as "\u00e9", an error
// page or a redirect's Location percent-encodes "/", "+" and "=" ("%2F" or "%2f"), an HTML
// page writes "&#43;" or "&amp;". An AWS secret key has "/" and "+". So each character of a
// value that is not a letter or a digit is looked for as itself and as each form the table
// below gives it, each character on its own: encoders differ in which characters they escape
// and in the case of their hex, and a value matches whatever mix of these its echo has. A
// letter, a digit, "-", "." and "_" are only ever themselves (no encoder escapes them; and a
// placeholder changes letters and digits only), so a value's form and its placeholder's in
// one encoding are the same length and differ where the value and placeholder do. Base64 is
// not a character's form but the whole value's (base64Encodings, below). Not here:
// compression (requests go with Accept-Encoding: identity), an encoding of an encoding.

// encoding is one way a server writes a character it echoes; form is "" for a character it
// leaves as it is. r is utf8.RuneError for a byte that is not UTF-8 (b holds it).
type encoding struct {
	name string
	form func(r rune, b []byte) string
}

var encodings = []encoding{
	{"JSON short escape", jsonShort},
	{"JSON \\u escape, lower-case hex", jsonU("\\u%04x")},
	{"JSON \\u escape, upper-case hex", jsonU("\\u%04X")},
	{"percent-encoding, upper-case hex", percent("%%%02X")},
	{"percent-encoding, lower-case hex", percent("%%%02x")},
	{"form encoding's space", func(r rune, _ []byte) string { return formSpace[r] }},
	{"HTML decimal reference", htmlRef("&#%d;")},
	{"HTML hex reference, lower-case", htmlRef("&#x%x;")},
	{"HTML hex reference, upper-case", htmlRef("&#x%X;")},
	{"HTML named reference", func(r rune, _ []byte) string { return htmlNamed[r] }},
}

// A server also echoes a value inside a longer base64 run: a token minted from a request
// field, a dump of the request, a JWT's payload. Each base64 character holds 6 bits, so the
// value is written one of three ways by where it falls in the run (the bytes before it, mod
// 3), and the characters at its two edges mix 2 or 4 of its bits with its neighbours'. What is
// looked for is each alignment's core: the characters that hold the value's bits alone, as
// themselves only (a core escaped again, "\/" or "%2F", is an encoding of an encoding); a
// core found becomes the placeholder's core of that alignment, of its length (base64 of
// values of one length is of one length). Padding falls outside every core, so padded and
// unpadded runs are alike. The edge characters stay: at most 4 bits of the value's first byte
// and 4 of its last.
var base64Encodings = []struct {
	name string
	enc  *base64.Encoding
}{
	{"base64, standard alphabet", base64.StdEncoding},
	{"base64, URL alphabet", base64.URLEncoding},
}

// base64Swaps are a value's base64 cores, each alphabet's in each alignment, and the
// placeholder's in their place.
func base64Swaps(s swap) []swap {
	out := make([]swap, 0, 3*len(base64Encodings))
	for _, e := range base64Encodings {
		for before := range 3 {
			out = append(out, swap{real: base64Core(e.enc, before, s.real), ph: base64Core(e.enc, before, s.ph), asIs: true})
		}
	}
	return out
}

// base64Core is b's characters in a base64 run where it follows before bytes: from the first
// character whose 6 bits are all b's to the last.
func base64Core(enc *base64.Encoding, before int, b []byte) []byte {
	run := enc.EncodeToString(append(make([]byte, before), b...))
	return []byte(run[(8*before+5)/6 : 8*(before+len(b))/6])
}

var (
	jsonShorts = map[rune]string{'"': `\"`, '\\': `\\`, '/': `\/`, '\t': `\t`}
	formSpace  = map[rune]string{' ': "+"}
	htmlNamed  = map[rune]string{'&': "&amp;", '<': "&lt;", '>': "&gt;", '"': "&quot;", '\'': "&apos;"}
)

func jsonShort(r rune, _ []byte) string { return jsonShorts[r] }

// jsonU writes a character as JSON's \u escape, a pair of them past the BMP.
func jsonU(f string) func(rune, []byte) string {
	return func(r rune, b []byte) string {
		if r == utf8.RuneError && len(b) == 1 {
			return "" // not UTF-8: an encoder writes U+FFFD, whatever the byte was
		}
		if r > 0xffff {
			r -= 0x10000
			return fmt.Sprintf(f, 0xd800+(r>>10)) + fmt.Sprintf(f, 0xdc00+(r&0x3ff))
		}
		return fmt.Sprintf(f, r)
	}
}

func percent(f string) func(rune, []byte) string {
	return func(_ rune, b []byte) string {
		var s strings.Builder
		for _, c := range b {
			fmt.Fprintf(&s, f, c)
		}
		return s.String()
	}
}

func htmlRef(f string) func(rune, []byte) string {
	return func(r rune, b []byte) string {
		if r == utf8.RuneError && len(b) == 1 {
			return ""
		}
		return fmt.Sprintf(f, r)
	}
}

// pattern is a value compiled for the search: a unit per character, each with the forms it
// may take in an echo. A pattern keeps scratch space: one goroutine uses it at a time.
type pattern struct {
	units []unit
	ph    []byte
	span  int       // the most bytes the value can take, its longest form
	first [256]bool // the bytes a form of the first unit begins with
	reach [][]int   // scratch: where each unit can begin, for one start
}

type unit struct{ forms []form }

// form is a character as an echo may hold it, and what the sandbox gets in its place: the
// placeholder's character in the same encoding, or nil where that is of another length.
type form struct{ b, out []byte }

// compile makes s's pattern. A value and its placeholder share every character but letters
// and digits, so each form of a character has a placeholder's form of its length. Basic
// credentials (base64) are not of one shape with the sandbox's: the sandbox knows neither
// where the real one has "+", "/" or "=" nor which forms the host gave them, so the span
// counts each character's longest form, what any of them could take.
func compile(s swap) *pattern {
	p := &pattern{ph: s.ph}
	same := sameShape(s.real, s.ph)
	for off := 0; off < len(s.real); {
		r, w := utf8.DecodeRune(s.real[off:])
		c, ph := s.real[off:off+w], s.ph[min(off, len(s.ph)):min(off+w, len(s.ph))]
		u := unit{forms: []form{{b: c, out: ph}}}
		if !s.asIs && (!literal(c) || !same) {
			pr, _ := utf8.DecodeRune(ph)
			for _, e := range encodings {
				u.add(e.form(r, c), e.form(pr, ph), ph)
			}
		}
		longest := 0
		for _, f := range u.forms {
			longest = max(longest, len(f.b))
		}
		if !same && !s.asIs {
			longest = max(longest, asciiLongest)
		}
		p.span += longest
		p.units = append(p.units, u)
		off += w
	}
	if len(p.units) > 0 {
		for _, f := range p.units[0].forms {
			p.first[f.b[0]] = true
		}
	}
	p.reach = make([][]int, len(p.units)+1)
	return p
}

// add puts a character's form in an encoding (fc), with the placeholder's (fp, or the
// placeholder's character itself where the encoding leaves it), unless it has it already.
func (u *unit) add(fc, fp string, ph []byte) {
	if fc == "" {
		return
	}
	for _, f := range u.forms {
		if string(f.b) == fc {
			return
		}
	}
	out := []byte(fp)
	if fp == "" {
		out = ph
	}
	if len(out) != len(fc) {
		out = nil
	}
	u.forms = append(u.forms, form{b: []byte(fc), out: out})
}

// asciiLongest is the longest form of any ASCII character: what a character of a value whose
// shape the placeholder does not show may take.
var asciiLongest = func() int {
	n := 1
	for c := rune(0x20); c < 0x7f; c++ {
		for _, e := range encodings {
			n = max(n, len(e.form(c, []byte{byte(c)})))
		}
	}
	return n
}()

func alnum(b []byte) bool { return len(b) == 1 && classOf(rune(b[0])) != "" }

// literal reports whether a value's character is looked for as itself only.
func literal(b []byte) bool {
	return alnum(b) || string(b) == "-" || string(b) == "." || string(b) == "_"
}

// sameShape reports whether a placeholder differs from its value in letters and digits only.
func sameShape(real, ph []byte) bool {
	if len(real) != len(ph) {
		return false
	}
	for i := range real {
		if real[i] != ph[i] && (!alnum(real[i:i+1]) || !alnum(ph[i:i+1])) {
			return false
		}
	}
	return true
}

// overlay writes the placeholder over every occurrence of the value that begins in raw
// before limit, in any of its forms, into out (raw's copy), and reports whether there was
// one. Where two readings of raw from one start both match, each is written.
func (p *pattern) overlay(out, raw []byte, limit int) bool {
	found := false
	for i := 0; i < limit && len(p.units) > 0; i++ {
		if p.first[raw[i]] && p.writeAt(out, raw, i) {
			found = true
		}
	}
	return found
}

// writeAt matches the value at raw[i:]: reach[k] is every offset the k-th unit can begin at,
// found forward; then, backward, each unit's form that lies on a whole match is written.
func (p *pattern) writeAt(out, raw []byte, i int) bool {
	p.reach[0] = append(p.reach[0][:0], i)
	for k, u := range p.units {
		next := p.reach[k+1][:0]
		for _, o := range p.reach[k] {
			for _, f := range u.forms {
				if bytes.HasPrefix(raw[o:], f.b) && !contains(next, o+len(f.b)) {
					next = append(next, o+len(f.b))
				}
			}
		}
		p.reach[k+1] = next
		if len(next) == 0 {
			return false
		}
	}
	whole := true
	live := p.reach[len(p.units)]
	for k := len(p.units) - 1; k >= 0; k-- {
		var back []int
		for _, o := range p.reach[k] {
			for _, f := range p.units[k].forms {
				if bytes.HasPrefix(raw[o:], f.b) && contains(live, o+len(f.b)) {
					back = append(back, o)
					copy(out[o:], f.out)
					whole = whole && f.out != nil
				}
			}
		}
		live = back
	}
	if !whole {
		p.fill(out, i)
	}
	return true
}

// fill writes the placeholder, then "*", over each match from i: a form of the value's
// character whose placeholder character's form is of another length (Basic credentials'
// "/" against the sandbox's "Q", "\/" in PHP's JSON) cannot be written in its place, and
// writing something else there would show where the value has that character.
func (p *pattern) fill(out []byte, i int) {
	for _, end := range p.reach[len(p.units)] {
		n := copy(out[i:end], p.ph)
		copy(out[i+n:end], bytes.Repeat([]byte("*"), end-i-n))
	}
}

// contains reports whether a holds x: the sets here are a few offsets long.
func contains(a []int, x int) bool {
	for _, y := range a {
		if y == x {
			return true
		}
	}
	return false
}

// matches reports whether b holds the value in any form.
func (p *pattern) matches(b []byte) bool { return p.overlay(bytes.Clone(b), b, len(b)) }
