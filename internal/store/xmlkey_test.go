package store_test

import (
	"testing"
	"unicode/utf8"

	"github.com/boxcar-run/boxcar/internal/store"
)

// xmlChar is XML 1.0's Char production: what an S3 listing, which is XML, can carry.
func xmlChar(r rune) bool {
	return r == 0x9 || r == 0xA || r == 0xD || 0x20 <= r && r <= 0xD7FF || 0xE000 <= r && r <= 0xFFFD || 0x10000 <= r && r <= 0x10FFFF
}

// TestWritableKeysListWithoutURLEncoding: a server that ignores the listing's
// encoding-type=url (versitygw) sends keys as they are in XML, so only store.WritableKey keeps
// a key Boxcar writes listable there. No character XML 1.0 cannot carry passes it, at any code
// point, nor a byte sequence that is no UTF-8 (a surrogate's encoding, a lone byte), nor a
// line end an XML reader would rewrite (CR), nor a backslash, which SeaweedFS lists as a slash.
func TestWritableKeysListWithoutURLEncoding(t *testing.T) {
	t.Parallel()
	for r := rune(0); r <= utf8.MaxRune; r++ {
		if !utf8.ValidRune(r) {
			continue // a surrogate: no UTF-8 string holds it (the byte rows below)
		}
		key := "runs/x/a" + string(r) + "b"
		if store.WritableKey(key) && (!xmlChar(r) || r == '\r' || r == '\\') {
			t.Errorf("WritableKey(%q) is true: U+%04X cannot be listed without URL encoding", key, r)
		}
	}
	for _, raw := range []string{"a\xed\xa0\x80b", "a\xffb", "a\xc0\xafb", "a\xf4\x90\x80\x80b"} {
		if store.WritableKey("runs/x/" + raw) {
			t.Errorf("WritableKey(%q) is true for bytes that are no UTF-8", raw)
		}
	}
}
