package cli

import (
	"fmt"
	"strings"
	"unicode"
	"unicode/utf8"
)

// Escape makes text that came from elsewhere (a job, a model, an object name, a config file)
// safe to print on a terminal: control characters (C0, C1, DEL, so every
// escape sequence), Unicode format characters (Cf: bidi overrides such as U+202E, zero-width
// characters), line and paragraph separators are written as \u escapes (\u001b, \u202e; \n,
// \r, \t for those three), invalid UTF-8 as \xNN. Nothing else changes, so ordinary text reads as it was written.
func Escape(s string) string {
	if !needsCleaning(s) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); {
		r, size := utf8.DecodeRuneInString(s[i:])
		switch {
		case r == utf8.RuneError && size == 1:
			fmt.Fprintf(&b, `\x%02x`, s[i])
		case r == '\n':
			b.WriteString(`\n`)
		case r == '\r':
			b.WriteString(`\r`)
		case r == '\t':
			b.WriteString(`\t`)
		case Unsafe(r):
			fmt.Fprintf(&b, `\u%04x`, r)
		default:
			b.WriteRune(r)
		}
		i += size
	}
	return b.String()
}

func needsCleaning(s string) bool {
	for i := 0; i < len(s); {
		r, size := utf8.DecodeRuneInString(s[i:])
		if (r == utf8.RuneError && size == 1) || Unsafe(r) {
			return true
		}
		i += size
	}
	return false
}

// Unsafe reports whether r must not reach a terminal as it is: a control character (C0, C1,
// DEL), a Unicode format character (Cf) or a line or paragraph separator.
func Unsafe(r rune) bool {
	return unicode.IsControl(r) || unicode.In(r, unicode.Cf, unicode.Zl, unicode.Zp)
}
