package agent

import (
	"strings"
	"unicode/utf8"

	"github.com/boxcar-run/boxcar/internal/textcut"
)

// The bounds on text that goes to the model (max_output_bytes, an error's 1 KiB,
// max_conversation_bytes) count the text as the model gets it: inside a JSON string, where
// encoding/json writes a control byte, an invalid UTF-8 byte, U+2028, U+2029, '<', '>' and '&'
// as a 6-byte \u escape, and a quote, a backslash, \n, \r, \t, \b and \f as 2 bytes. Counted in
// raw bytes, a tool printing control bytes or binary sent the model six times its cap.

// asciiCost is the bytes encoding/json writes for each ASCII byte inside a string.
var asciiCost = func() (cost [utf8.RuneSelf]int) {
	for c := range cost {
		switch {
		case strings.IndexByte("\"\\\n\r\t\b\f", byte(c)) >= 0:
			cost[c] = 2
		case c < 0x20 || c == '<' || c == '>' || c == '&':
			cost[c] = 6
		default:
			cost[c] = 1
		}
	}
	return cost
}()

// jsonRune returns the length in bytes of the character s starts with (an invalid byte is one)
// and the bytes encoding/json writes for it inside a string.
func jsonRune(s string) (size, cost int) {
	if c := s[0]; c < utf8.RuneSelf {
		return 1, asciiCost[c]
	}
	r, n := utf8.DecodeRuneInString(s)
	if (r == utf8.RuneError && n == 1) || r == '\u2028' || r == '\u2029' {
		return n, 6
	}
	return n, n
}

// jsonLen is the length of s inside a JSON string as encoding/json writes it, its quotes aside.
func jsonLen(s string) int {
	n := 0
	for i := 0; i < len(s); {
		size, cost := jsonRune(s[i:])
		i += size
		n += cost
	}
	return n
}

// jsonHead returns the longest head of s whose jsonLen is at most n, ending between characters.
func jsonHead(s string, n int) string {
	used := 0
	for i := 0; i < len(s); {
		size, cost := jsonRune(s[i:])
		if used+cost > n {
			return s[:i]
		}
		i += size
		used += cost
	}
	return s
}

// jsonTail returns the longest tail of s whose jsonLen is at most n, beginning where a character
// does. It is no longer in bytes than in JSON, so it starts within the last n bytes.
func jsonTail(s string, n int) string {
	t := textcut.Tail(s, n)
	for used := jsonLen(t); used > n; {
		size, cost := jsonRune(t)
		t = t[size:]
		used -= cost
	}
	return t
}
