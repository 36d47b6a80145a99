// Package textcut owns cutting a text to a bound in bytes without splitting a UTF-8 encoded
// character: an error quoting what a server said, a path a job made, a command a model asked
// for, a tool's output. It does not own what marks a cut (an ellipsis, a count of the bytes
// cut: each caller says that its own way), nor making a text valid UTF-8: invalid bytes stay
// as they are, and a cut among them falls where the bound says.
package textcut

import "unicode/utf8"

// Head returns the longest head of s of at most n bytes that does not end inside a character:
// s itself when it fits, and nothing for n of 0 or less. The cut moves back at most
// utf8.UTFMax-1 bytes from n, as far as the start of the character at n can be; where no
// character starts that near (invalid UTF-8) there is none to keep whole, and the cut is at n.
func Head[T ~string | ~[]byte](s T, n int) T {
	if len(s) <= n {
		return s
	}
	return s[:boundary(s, max(n, 0), -1)]
}

// Tail returns the longest tail of s of at most n bytes that does not begin inside a
// character: s itself when it fits, and nothing for n of 0 or less. As Head, the cut moves at
// most utf8.UTFMax-1 bytes, forward here, and in invalid UTF-8 stays at len(s)-n.
func Tail[T ~string | ~[]byte](s T, n int) T {
	if len(s) <= n {
		return s
	}
	return s[boundary(s, len(s)-max(n, 0), +1):]
}

// boundary is the first index from i, going step (-1 back, +1 forward) at most
// utf8.UTFMax-1 bytes, where a character starts or s ends; i itself when there is none.
func boundary[T ~string | ~[]byte](s T, i, step int) int {
	for j, moved := i, 0; moved < utf8.UTFMax; j, moved = j+step, moved+1 {
		if j <= 0 || j >= len(s) || utf8.RuneStart(s[j]) {
			return j
		}
	}
	return i
}
