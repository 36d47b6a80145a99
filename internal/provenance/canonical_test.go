package provenance

import (
	"bytes"
	"encoding/json"
	"errors"
	"math"
	"regexp"
	"slices"
	"strings"
	"testing"
	"unicode/utf16"
	"unicode/utf8"

	"github.com/gowebpki/jcs"
)

// TestCanonicalMatchesJCS compares canonicalJSON with gowebpki/jcs, an RFC 8785
// implementation, on the cases where a plain encoding/json differs from it: U+2028 and
// U+2029 (which encoding/json escapes), control characters, member order by UTF-16 code
// units, and ECMAScript number formatting.
func TestCanonicalMatchesJCS(t *testing.T) {
	tests := []struct{ name, in string }{
		{"line and paragraph separators", "{\"s\":\"a\u2028b\u2029c\"}"},
		{"controls", `{"s":"\u0000\u0001\b\t\n\u000b\f\r\u001f\u007f"}`},
		{"quotes, backslash, solidus, html", `{"s":"\"\\/<>&"}`},
		{"escaped non-ASCII", `{"s":"\u00e9\u20ac\ud83d\ude00"}`},
		{"member order by UTF-16", "{\"\uff61\":1,\"\U0001F600\":2,\"a\":3,\"\u00e9\":4,\"A\":5,\"\":6}"},
		{"nested", `{"b":[{"z":null,"a":true},false,[]],"a":{}}`},
		{"integers", `[0,-0,1,-1,9007199254740991,-9007199254740991,1e3,100E-2]`},
		{"fractions", `[0.1,-0.5,1.5e-3,0.000001,1e-7,333333333.3333333,0.30000000000000004]`},
		{"large and small", `[1e21,1e20,123456789012345680000,1.7976931348623157e308,5e-324,2.2250738585072014e-308,-1e-7]`},
		{"white space", " {\n\t\"b\" : [ 1 , 2 ] ,\r\"a\":\"x\" } "},
		{"sorted already", `{"a":1,"b":{"c":2,"d":3}}`},
		{"RFC 8785 example", `{"numbers":[333333333.33333329,1E30,4.50,2e-3,0.000000000000000000000000001],"string":"\u20ac$\u000F\u000aA'\u0042\u0022\u005c\\\"\/","literals":[null,true,false]}`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			want, err := jcs.Transform([]byte(tt.in))
			if err != nil {
				t.Fatalf("jcs: %v", err)
			}
			got, err := canonicalJSON([]byte(tt.in))
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(got, want) {
				t.Errorf("canonicalJSON(%s)\n got %s\nwant %s", tt.in, got, want)
			}
		})
	}
}

// TestCanonicalBigIntegers: an integer beyond 2^53 keeps every digit (JCS has no form for it).
func TestCanonicalBigIntegers(t *testing.T) {
	for _, in := range []string{"4611686018427387905", "-9223372036854775808", "9007199254740993"} {
		got, err := canonicalJSON([]byte(in))
		if err != nil || string(got) != in {
			t.Errorf("canonicalJSON(%s) = %s, %v; want the digits unchanged", in, got, err)
		}
	}
}

// FuzzCompareUTF16 holds compareUTF16 to its definition: the order of the strings' UTF-16
// code units.
func FuzzCompareUTF16(f *testing.F) {
	for _, s := range [][2]string{
		{"\uff61", "\U0001F600"}, {"\U0001F600", "\ue000"}, {"\ud7ff", "\U00010000"}, {"a", "ab"},
		{"", "a"}, {"\u00e9", "e"}, {"\U0010FFFF", "\uffff"}, {"x\U0001F600", "x\uffff"}, {"same", "same"},
	} {
		f.Add(s[0], s[1])
	}
	f.Fuzz(func(t *testing.T, a, b string) {
		if !utf8.ValidString(a) || !utf8.ValidString(b) {
			return // refused by appendString before any order matters
		}
		want := slices.Compare(utf16.Encode([]rune(a)), utf16.Encode([]rune(b)))
		if got := compareUTF16([]byte(a), []byte(b)); got != want {
			t.Errorf("compareUTF16(%+q, %+q) = %d, want %d", a, b, got, want)
		}
	})
}

// FuzzCanonicalStringsMatchJCS holds the strings canonicalJSON writes, as names and as
// values, to the RFC 8785 implementation.
func FuzzCanonicalStringsMatchJCS(f *testing.F) {
	for _, s := range []string{"", "plain", "a\u2028b", "\x00\x1f\x7f\"\\/", "tab\there", "\u00e9\U0001F600\uffff", "<&>"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		if !utf8.ValidString(s) {
			return
		}
		in, err := json.Marshal(map[string]string{"k": s, s: "v"})
		if err != nil {
			t.Fatal(err)
		}
		want, err := jcs.Transform(in)
		if err != nil {
			t.Fatalf("jcs: %v", err)
		}
		got, err := canonicalJSON(in)
		if err != nil || !bytes.Equal(got, want) {
			t.Errorf("canonicalJSON(%s) = %s, %v; want %s", in, got, err, want)
		}
	})
}

// TestCanonicalRefuses: a text that is not one JSON value, or that I-JSON refuses, is an error
// (ErrInvalid), never some canonical form of a guess.
func TestCanonicalRefuses(t *testing.T) {
	tests := []struct{ name, in string }{
		{"empty", ""},
		{"trailing data", `{} {}`},
		{"trailing comma", `[1,]`},
		{"missing colon", `{"a" 1}`},
		{"unquoted name", `{a:1}`},
		{"duplicate name", `{"a":1,"b":2,"a":3}`},
		{"duplicate name by escape", `{"a":1,"\u0061":2}`},
		{"leading zero", `[01]`},
		{"bare point", `[1.]`},
		{"no exponent digits", `[1e]`},
		{"plus sign", `[+1]`},
		{"too big for a double", `[1e400]`},
		{"control character", "[\"a\tb\"]"},
		{"unknown escape", `["\x41"]`},
		{"short unicode escape", `["\u12"]`},
		{"lone high surrogate", `["\ud83d"]`},
		{"lone low surrogate", `["\ude00"]`},
		{"invalid UTF-8", "[\"\xff\"]"},
		{"unterminated string", `["abc`},
		{"unterminated object", `{"a":1`},
		{"misspelt literal", `[nul]`},
		{"too deep", strings.Repeat("[", maxDepth+2) + strings.Repeat("]", maxDepth+2)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := canonicalJSON([]byte(tt.in))
			if !errors.Is(err, ErrInvalid) {
				t.Errorf("canonicalJSON(%q) = %q, %v; want an error wrapping ErrInvalid", tt.in, got, err)
			}
		})
	}
}

// FuzzCanonicalMatchesJCS holds whole texts to the RFC 8785 implementation: what both accept
// comes out the same. Integers beyond 2^53 are left out, where canonicalJSON keeps the digits
// on purpose (TestCanonicalBigIntegers), and so are texts jcs takes that I-JSON refuses
// (duplicate names).
func FuzzCanonicalMatchesJCS(f *testing.F) {
	for _, s := range []string{
		`{"b":[{"z":null,"a":true},false,[]],"a":{}}`, `[0.1,-0.5,1e21,5e-324,-0]`, `"\u2028\ud83d\ude00"`,
		"{\"\uff61\":1,\"\U0001F600\":2}", ` { "a" : [ 1 , "x" ] } `, `{"a":{"c":1,"b":2},"A":3}`,
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, in string) {
		got, err := canonicalJSON([]byte(in))
		if err != nil {
			return
		}
		var v any
		if json.Unmarshal([]byte(in), &v) != nil {
			t.Fatalf("canonicalJSON took %q, which encoding/json refuses", in)
		}
		if hasBigInteger(v) {
			return
		}
		want, err := jcs.Transform([]byte(in))
		if err != nil {
			t.Fatalf("canonicalJSON took %q, which jcs refuses: %v", in, err)
		}
		if !bytes.Equal(got, want) {
			t.Errorf("canonicalJSON(%q) = %s, want %s", in, got, want)
		}
	})
}

// hasBigInteger reports whether v holds an integer whose digits a double does not keep.
func hasBigInteger(v any) bool {
	switch v := v.(type) {
	case float64:
		return v == math.Trunc(v) && math.Abs(v) > 1<<53
	case []any:
		return slices.ContainsFunc(v, hasBigInteger)
	case map[string]any:
		for _, e := range v {
			if hasBigInteger(e) {
				return true
			}
		}
	}
	return false
}

// FuzzIsHexSHA256 holds isHexSHA256 to the pattern it spells out.
func FuzzIsHexSHA256(f *testing.F) {
	pattern := regexp.MustCompile(`^[0-9a-f]{64}$`)
	for _, s := range []string{"", strings.Repeat("a", 64), strings.Repeat("A", 64), strings.Repeat("0", 63), strings.Repeat("f", 65),
		strings.Repeat("0", 63) + "g", strings.Repeat("9", 63) + "/", strings.Repeat("0", 63) + ":", strings.Repeat("0", 63) + "`"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		if got, want := isHexSHA256(s), pattern.MatchString(s); got != want {
			t.Fatalf("isHexSHA256(%q) = %v, the pattern says %v", s, got, want)
		}
	})
}
