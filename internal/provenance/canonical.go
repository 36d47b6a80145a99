package provenance

import (
	"bytes"
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"slices"
	"strconv"
	"unicode/utf8"
)

// decodeJSON reads exactly one JSON value, keeping numbers as written.
func decodeJSON(data []byte, v any) error {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	if err := dec.Decode(v); err != nil {
		return fmt.Errorf("%w: %v", ErrInvalid, err)
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return fmt.Errorf("%w: trailing data after the JSON value", ErrInvalid)
	}
	return nil
}

// maxSafeInteger is the largest integer every IEEE 754 double holds exactly (2^53 - 1).
const maxSafeInteger = 1<<53 - 1

// encodeCanonical writes a value that decodeJSON read (maps, slices, strings, json.Number,
// bools, nil) in the JSON Canonicalization Scheme of RFC 8785: object members sorted by the
// UTF-16 code units of their names, no white space, strings with only the escapes JCS allows
// (U+2028 and U+2029 stay as they are, unlike encoding/json's output), numbers as ECMAScript
// prints the double.
//
// JCS is defined for I-JSON, whose numbers are doubles. An integer beyond 2^53 (a seed the
// operator chose) has no double that keeps its digits; it is written with all of them, as it
// was before, since recording a different seed than the one sent would be worse. No other
// number Boxcar records comes near 2^53.
func encodeCanonical(v any) ([]byte, error) {
	var buf bytes.Buffer
	if err := writeCanonical(&buf, v); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

func writeCanonical(buf *bytes.Buffer, v any) error {
	switch v := v.(type) {
	case nil:
		buf.WriteString("null")
	case bool:
		buf.WriteString(strconv.FormatBool(v))
	case string:
		return writeString(buf, v)
	case json.Number:
		return writeNumber(buf, v)
	case []any:
		buf.WriteByte('[')
		for i, e := range v {
			if i > 0 {
				buf.WriteByte(',')
			}
			if err := writeCanonical(buf, e); err != nil {
				return err
			}
		}
		buf.WriteByte(']')
	case map[string]any:
		keys := make([]string, 0, len(v))
		for k := range v {
			keys = append(keys, k)
		}
		slices.SortFunc(keys, compareUTF16)
		buf.WriteByte('{')
		for i, k := range keys {
			if i > 0 {
				buf.WriteByte(',')
			}
			if err := writeString(buf, k); err != nil {
				return err
			}
			buf.WriteByte(':')
			if err := writeCanonical(buf, v[k]); err != nil {
				return err
			}
		}
		buf.WriteByte('}')
	default:
		return fmt.Errorf("%w: canonical JSON: unexpected %T", ErrInvalid, v)
	}
	return nil
}

// compareUTF16 orders strings by their UTF-16 code units, as RFC 8785 sorts member names.
// UTF-8 byte order differs from it only where a character above U+FFFF meets one in
// U+E000..U+FFFF, so it compares runes and moves that range (utf16Order) instead of encoding
// both strings: a manifest's keys are sorted on every commit.
func compareUTF16(a, b string) int {
	for a != "" && b != "" {
		ra, na := utf8.DecodeRuneInString(a)
		rb, nb := utf8.DecodeRuneInString(b)
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

// writeString escapes what RFC 8785 (section 3.2.2.2) escapes: the quote, the backslash and
// the control characters below U+0020, with the short forms where JSON has them and
// lowercase \u00xx otherwise. Every other character is written as its UTF-8.
func writeString(buf *bytes.Buffer, s string) error {
	if !utf8.ValidString(s) {
		return fmt.Errorf("%w: canonical JSON: a string is not valid UTF-8", ErrInvalid)
	}
	const hex = "0123456789abcdef"
	buf.WriteByte('"')
	start := 0 // the characters from here on are written as they are, in one go
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c >= 0x20 && c != '"' && c != '\\' {
			continue
		}
		buf.WriteString(s[start:i])
		start = i + 1
		switch c {
		case '"', '\\':
			buf.WriteByte('\\')
			buf.WriteByte(c)
		case '\b':
			buf.WriteString(`\b`)
		case '\f':
			buf.WriteString(`\f`)
		case '\n':
			buf.WriteString(`\n`)
		case '\r':
			buf.WriteString(`\r`)
		case '\t':
			buf.WriteString(`\t`)
		default:
			buf.WriteString(`\u00`)
			buf.WriteByte(hex[c>>4])
			buf.WriteByte(hex[c&0xf])
		}
	}
	buf.WriteString(s[start:])
	buf.WriteByte('"')
	return nil
}

// writeNumber prints n as ECMAScript's Number.prototype.toString prints the double nearest to
// it (RFC 8785 section 3.2.2.3), except for integers beyond 2^53; see encodeCanonical.
func writeNumber(buf *bytes.Buffer, n json.Number) error {
	if i, err := strconv.ParseInt(string(n), 10, 64); err == nil {
		if i > maxSafeInteger || i < -maxSafeInteger {
			buf.WriteString(strconv.FormatInt(i, 10))
			return nil
		}
		// A safe integer prints as its digits; "-0" becomes "0" below.
		if i != 0 {
			buf.WriteString(strconv.FormatInt(i, 10))
			return nil
		}
	}
	f, err := strconv.ParseFloat(string(n), 64)
	if err != nil || math.IsInf(f, 0) || math.IsNaN(f) {
		return fmt.Errorf("%w: canonical JSON: number %s is not a finite double", ErrInvalid, n)
	}
	buf.Write(formatES6(f))
	return nil
}

// formatES6 is ECMAScript's Number-to-String for a finite double: the shortest digits that
// read back as f, in fixed notation for 1e-6 <= |f| < 1e21, else as d.ddde±x.
func formatES6(f float64) []byte {
	if f == 0 {
		return []byte("0") // -0 too
	}
	abs := math.Abs(f)
	format := byte('f')
	if abs < 1e-6 || abs >= 1e21 {
		format = 'e'
	}
	b := strconv.AppendFloat(nil, f, format, -1, 64)
	if format == 'e' {
		// Go writes e-07 and e+07; ECMAScript writes e-7 and e+7.
		if n := len(b); n >= 4 && b[n-4] == 'e' && b[n-2] == '0' {
			b = append(b[:n-2], b[n-1])
		}
	}
	return b
}
