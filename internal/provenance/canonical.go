package provenance

import (
	"bytes"
	"cmp"
	"errors"
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
	"unicode/utf16"
	"unicode/utf8"
)

// maxDepth bounds the nesting canonicalJSON follows: a manifest is a few levels deep, and a
// deeper text would only grow the stack.
const maxDepth = 200

// canonicalJSON rewrites one JSON text in the JSON Canonicalization Scheme of RFC 8785:
// object members sorted by the UTF-16 code units of their names, no white space, strings with
// only the escapes JCS allows (U+2028 and U+2029 stay as they are, unlike encoding/json's
// output), numbers as ECMAScript prints the double. It works on the text itself, without
// decoding it into maps: the manifest is canonicalised on every commit, and a decode into maps
// was half of building it.
//
// JCS is defined for I-JSON, whose numbers are doubles. An integer beyond 2^53 (a seed the
// operator chose) has no double that keeps its digits; it is written with all of them, as it
// was before, since recording a different seed than the one sent would be worse. No other
// number Boxcar records comes near 2^53.
func canonicalJSON(data []byte) ([]byte, error) {
	return appendCanonicalAt(make([]byte, 0, len(data)), data, 0)
}

// appendCanonicalAt appends the canonical form of data, a value at depth in a document.
func appendCanonicalAt(out, data []byte, depth int) ([]byte, error) {
	// The scratch holds an object's members while they are put in order, the whole text at
	// worst: grown from nothing on every call, its growing was a sixth of the work.
	c := canonicalizer{in: data, out: out, scratch: make([]byte, 0, len(data))}
	c.skipSpace()
	err := c.value(depth)
	if err == nil {
		if c.skipSpace(); c.pos < len(c.in) {
			err = errors.New("trailing data after the JSON value")
		}
	}
	if err != nil {
		return nil, fmt.Errorf("%w: canonical JSON at byte %d: %v", ErrInvalid, c.pos, err)
	}
	return c.out, nil
}

// canonicalizer reads in from pos and appends the canonical form to out.
type canonicalizer struct {
	in      []byte
	pos     int
	out     []byte
	scratch []byte // an object's members while they are put in order
}

// member is an object member as written to out: its name and the span of `"name":value`.
type member struct {
	name       []byte
	start, end int
}

func (c *canonicalizer) skipSpace() {
	for c.pos < len(c.in) {
		switch c.in[c.pos] {
		case ' ', '\t', '\n', '\r':
			c.pos++
		default:
			return
		}
	}
}

func (c *canonicalizer) value(depth int) error {
	if depth > maxDepth {
		return fmt.Errorf("nested deeper than %d levels", maxDepth)
	}
	if c.pos >= len(c.in) {
		return errors.New("unexpected end of the text")
	}
	switch b := c.in[c.pos]; {
	case b == '{':
		return c.object(depth)
	case b == '[':
		return c.array(depth)
	case b == '"':
		s, err := c.str()
		if err != nil {
			return err
		}
		c.out, err = appendString(c.out, s)
		return err
	case b == '-' || b >= '0' && b <= '9':
		return c.number()
	}
	for _, lit := range []string{"true", "false", "null"} {
		if len(c.in)-c.pos >= len(lit) && string(c.in[c.pos:c.pos+len(lit)]) == lit {
			c.out = append(c.out, lit...)
			c.pos += len(lit)
			return nil
		}
	}
	return fmt.Errorf("unexpected character %q", c.in[c.pos])
}

// expect consumes b after optional white space.
func (c *canonicalizer) expect(b byte) error {
	c.skipSpace()
	if c.pos >= len(c.in) || c.in[c.pos] != b {
		return fmt.Errorf("expected %q", b)
	}
	c.pos++
	return nil
}

// next reports whether a list goes on after a comma (true) or ends with end (false).
func (c *canonicalizer) next(end byte) (bool, error) {
	c.skipSpace()
	if c.pos < len(c.in) {
		switch c.in[c.pos] {
		case ',':
			c.pos++
			c.skipSpace()
			return true, nil
		case end:
			c.pos++
			return false, nil
		}
	}
	return false, fmt.Errorf("expected ',' or %q", end)
}

// empty consumes end when the list that was just opened has nothing in it.
func (c *canonicalizer) empty(end byte) bool {
	c.skipSpace()
	if c.pos < len(c.in) && c.in[c.pos] == end {
		c.pos++
		return true
	}
	return false
}

func (c *canonicalizer) array(depth int) error {
	c.pos++
	c.out = append(c.out, '[')
	if c.empty(']') {
		c.out = append(c.out, ']')
		return nil
	}
	for more := true; more; {
		if err := c.value(depth + 1); err != nil {
			return err
		}
		var err error
		if more, err = c.next(']'); err != nil {
			return err
		}
		if more {
			c.out = append(c.out, ',')
		}
	}
	c.out = append(c.out, ']')
	return nil
}

// object writes the members as they come, then puts them in order in place when they were
// not: encoding/json writes a struct's fields in declaration order.
func (c *canonicalizer) object(depth int) error {
	c.pos++
	c.out = append(c.out, '{')
	body := len(c.out)
	var room [16]member // most objects fit, without an allocation
	members := room[:0]
	for more := !c.empty('}'); more; {
		if c.pos >= len(c.in) || c.in[c.pos] != '"' {
			return errors.New("expected a member name")
		}
		name, err := c.str()
		if err != nil {
			return err
		}
		if err := c.expect(':'); err != nil {
			return err
		}
		c.skipSpace()
		if len(members) > 0 {
			c.out = append(c.out, ',')
		}
		start := len(c.out)
		if c.out, err = appendString(c.out, name); err != nil {
			return err
		}
		c.out = append(c.out, ':')
		if err := c.value(depth + 1); err != nil {
			return err
		}
		members = append(members, member{name, start, len(c.out)})
		if more, err = c.next('}'); err != nil {
			return err
		}
	}
	byName := func(a, b member) int { return compareUTF16(a.name, b.name) }
	if !slices.IsSortedFunc(members, byName) {
		c.scratch = append(c.scratch[:0], c.out[body:]...)
		c.out = c.out[:body]
		slices.SortFunc(members, byName)
		for i, m := range members {
			if i > 0 {
				c.out = append(c.out, ',')
			}
			c.out = append(c.out, c.scratch[m.start-body:m.end-body]...)
		}
	}
	for i := 1; i < len(members); i++ {
		if bytes.Equal(members[i].name, members[i-1].name) {
			return fmt.Errorf("member %q appears twice", members[i].name)
		}
	}
	c.out = append(c.out, '}')
	return nil
}

// str reads a string and returns its characters, without the escapes: a slice of the input
// when it has none.
func (c *canonicalizer) str() ([]byte, error) {
	c.pos++ // the opening quote
	start := c.pos
	for c.pos < len(c.in) {
		switch b := c.in[c.pos]; {
		case b == '"':
			c.pos++
			return c.in[start : c.pos-1], nil
		case b == '\\':
			return c.unescape(start)
		case b < 0x20:
			return nil, errors.New("a control character in a string")
		}
		c.pos++
	}
	return nil, errors.New("a string does not end")
}

// unescape reads the rest of a string from its first backslash; start is where its
// characters began.
func (c *canonicalizer) unescape(start int) ([]byte, error) {
	s := append([]byte(nil), c.in[start:c.pos]...)
	for c.pos < len(c.in) {
		b := c.in[c.pos]
		switch {
		case b == '"':
			c.pos++
			return s, nil
		case b < 0x20:
			return nil, errors.New("a control character in a string")
		case b != '\\':
			s = append(s, b)
			c.pos++
			continue
		}
		if c.pos+1 >= len(c.in) {
			break
		}
		e := c.in[c.pos+1]
		c.pos += 2
		if short := shortEscapes[e]; short != 0 {
			s = append(s, short)
			continue
		}
		if e != 'u' {
			return nil, fmt.Errorf(`unknown escape \%c`, e)
		}
		r, err := c.hex4()
		if err != nil {
			return nil, err
		}
		if utf16.IsSurrogate(r) {
			// Only a high surrogate followed by an escaped low one makes a character.
			var lo rune = -1
			if c.pos+1 < len(c.in) && c.in[c.pos] == '\\' && c.in[c.pos+1] == 'u' {
				c.pos += 2
				if lo, err = c.hex4(); err != nil {
					return nil, err
				}
			}
			if r = utf16.DecodeRune(r, lo); r == utf8.RuneError {
				return nil, errors.New("an escaped surrogate that is not part of a pair")
			}
		}
		s = utf8.AppendRune(s, r)
	}
	return nil, errors.New("a string does not end")
}

// shortEscapes maps the character after a backslash to the one it stands for.
var shortEscapes = [256]byte{'"': '"', '\\': '\\', '/': '/', 'b': '\b', 'f': '\f', 'n': '\n', 'r': '\r', 't': '\t'}

func (c *canonicalizer) hex4() (rune, error) {
	if c.pos+4 > len(c.in) {
		return 0, errors.New(`a \u escape is cut short`)
	}
	n, err := strconv.ParseUint(string(c.in[c.pos:c.pos+4]), 16, 16)
	if err != nil {
		return 0, fmt.Errorf(`a \u escape is not four hex digits: %q`, c.in[c.pos:c.pos+4])
	}
	c.pos += 4
	return rune(n), nil
}

// number reads a number as JSON's grammar has it and writes it as appendNumber does.
func (c *canonicalizer) number() error {
	start := c.pos
	c.skipOne("-")
	first := c.pos
	if n := c.digits(); n == 0 || n > 1 && c.in[first] == '0' {
		return errors.New("a number's integer part is missing or has a leading zero")
	}
	if c.skipOne(".") && c.digits() == 0 {
		return errors.New("a number has no digits after its point")
	}
	if c.skipOne("eE") {
		c.skipOne("+-")
		if c.digits() == 0 {
			return errors.New("a number has no digits in its exponent")
		}
	}
	var err error
	c.out, err = appendNumber(c.out, string(c.in[start:c.pos]))
	return err
}

// skipOne consumes one of chars, if the next byte is one.
func (c *canonicalizer) skipOne(chars string) bool {
	if c.pos < len(c.in) && strings.IndexByte(chars, c.in[c.pos]) >= 0 {
		c.pos++
		return true
	}
	return false
}

// digits consumes decimal digits and says how many.
func (c *canonicalizer) digits() int {
	start := c.pos
	for c.pos < len(c.in) && c.in[c.pos] >= '0' && c.in[c.pos] <= '9' {
		c.pos++
	}
	return c.pos - start
}

// compareUTF16 orders strings by their UTF-16 code units, as RFC 8785 sorts member names.
// UTF-8 byte order differs from it only where a character above U+FFFF meets one in
// U+E000..U+FFFF, so it compares runes and moves that range (utf16Order) instead of encoding
// both strings: a manifest's keys are sorted on every commit.
func compareUTF16(a, b []byte) int {
	for len(a) > 0 && len(b) > 0 {
		ra, na := utf8.DecodeRune(a)
		rb, nb := utf8.DecodeRune(b)
		if ra != rb {
			return cmp.Compare(utf16Order(ra), utf16Order(rb))
		}
		a, b = a[na:], b[nb:]
	}
	return cmp.Compare(len(a), len(b))
}

// utf16Order moves U+E000-U+FFFF above every rune beyond U+FFFF, which UTF-16 writes with a
// first unit in U+D800-U+DBFF; the rest keep their order.
func utf16Order(r rune) rune {
	if r >= 0xE000 && r <= 0xFFFF {
		return r + 0x110000
	}
	return r
}

// appendString escapes what RFC 8785 (section 3.2.2.2) escapes: the quote, the backslash and
// the control characters below U+0020, with the short forms where JSON has them and
// lowercase \u00xx otherwise. Every other character is written as its UTF-8.
func appendString[S string | []byte](out []byte, s S) ([]byte, error) {
	if !utf8.ValidString(string(s)) {
		return nil, errors.New("a string is not valid UTF-8")
	}
	const hex = "0123456789abcdef"
	out = append(out, '"')
	start := 0 // the characters from here on are written as they are, in one go
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c >= 0x20 && c != '"' && c != '\\' {
			continue
		}
		out = append(out, s[start:i]...)
		start = i + 1
		switch c {
		case '"', '\\':
			out = append(out, '\\', c)
		case '\b':
			out = append(out, `\b`...)
		case '\f':
			out = append(out, `\f`...)
		case '\n':
			out = append(out, `\n`...)
		case '\r':
			out = append(out, `\r`...)
		case '\t':
			out = append(out, `\t`...)
		default:
			out = append(out, '\\', 'u', '0', '0', hex[c>>4], hex[c&0xf])
		}
	}
	out = append(out, s[start:]...)
	return append(out, '"'), nil
}

// appendNumber prints n as ECMAScript's Number.prototype.toString prints the double nearest to
// it (RFC 8785 section 3.2.2.3), except for integers beyond 2^53; see canonicalJSON.
func appendNumber(out []byte, n string) ([]byte, error) {
	// A safe integer prints as its digits, and so does a bigger one; "-0" becomes "0" below.
	if i, err := strconv.ParseInt(n, 10, 64); err == nil && i != 0 {
		return strconv.AppendInt(out, i, 10), nil
	}
	f, err := strconv.ParseFloat(n, 64)
	if err != nil || math.IsInf(f, 0) || math.IsNaN(f) {
		return nil, fmt.Errorf("number %s is not a finite double", n)
	}
	return appendES6(out, f), nil
}

// appendES6 is ECMAScript's Number-to-String for a finite double: the shortest digits that
// read back as f, in fixed notation for 1e-6 <= |f| < 1e21, else as d.ddde±x.
func appendES6(out []byte, f float64) []byte {
	if f == 0 {
		return append(out, '0') // -0 too
	}
	abs := math.Abs(f)
	format := byte('f')
	if abs < 1e-6 || abs >= 1e21 {
		format = 'e'
	}
	b := strconv.AppendFloat(out, f, format, -1, 64)
	if format == 'e' {
		// Go writes e-07 and e+07; ECMAScript writes e-7 and e+7.
		if n := len(b); n >= 4 && b[n-4] == 'e' && b[n-2] == '0' {
			b = append(b[:n-2], b[n-1])
		}
	}
	return b
}
