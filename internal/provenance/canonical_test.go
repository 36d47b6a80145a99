package provenance

import (
	"bytes"
	"encoding/json"
	"slices"
	"testing"
	"unicode/utf16"
	"unicode/utf8"

	"github.com/gowebpki/jcs"
)

// TestCanonicalMatchesJCS compares encodeCanonical with gowebpki/jcs, an RFC 8785
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
		{"RFC 8785 example", `{"numbers":[333333333.33333329,1E30,4.50,2e-3,0.000000000000000000000000001],"string":"\u20ac$\u000F\u000aA'\u0042\u0022\u005c\\\"\/","literals":[null,true,false]}`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			want, err := jcs.Transform([]byte(tt.in))
			if err != nil {
				t.Fatalf("jcs: %v", err)
			}
			var v any
			if err := decodeJSON([]byte(tt.in), &v); err != nil {
				t.Fatal(err)
			}
			got, err := encodeCanonical(v)
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(got, want) {
				t.Errorf("encodeCanonical(%s)\n got %s\nwant %s", tt.in, got, want)
			}
		})
	}
}

// TestCanonicalBigIntegers: an integer beyond 2^53 keeps every digit (JCS has no form for it).
func TestCanonicalBigIntegers(t *testing.T) {
	for _, in := range []string{"4611686018427387905", "-9223372036854775808", "9007199254740993"} {
		var v any
		if err := decodeJSON([]byte(in), &v); err != nil {
			t.Fatal(err)
		}
		got, err := encodeCanonical(v)
		if err != nil || string(got) != in {
			t.Errorf("encodeCanonical(%s) = %s, %v; want the digits unchanged", in, got, err)
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
			return // refused by writeString before any order matters
		}
		want := slices.Compare(utf16.Encode([]rune(a)), utf16.Encode([]rune(b)))
		if got := compareUTF16(a, b); got != want {
			t.Errorf("compareUTF16(%+q, %+q) = %d, want %d", a, b, got, want)
		}
	})
}

// FuzzCanonicalStringsMatchJCS holds the strings encodeCanonical writes, as names and as
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
		var v any
		if err := decodeJSON(in, &v); err != nil {
			t.Fatal(err)
		}
		got, err := encodeCanonical(v)
		if err != nil || !bytes.Equal(got, want) {
			t.Errorf("encodeCanonical(%s) = %s, %v; want %s", in, got, err, want)
		}
	})
}
