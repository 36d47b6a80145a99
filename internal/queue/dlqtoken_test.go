package queue

import (
	"strconv"
	"strings"
	"testing"
)

// TestDLQTokenIsInjective: every tenant and job id, valid or not, has a dead-letter subject
// token of its own, which names it back without loss (undo reverses the escape), is one
// NATS token, and is the name itself for a valid tenant or id.
func TestDLQTokenIsInjective(t *testing.T) {
	t.Parallel()
	undo := func(tok string) (string, bool) {
		if tok == noID {
			return "", true
		}
		var b strings.Builder
		for i := 0; i < len(tok); i++ {
			if tok[i] != '~' {
				b.WriteByte(tok[i])
				continue
			}
			if i+2 >= len(tok) {
				return "", false
			}
			n, err := strconv.ParseUint(tok[i+1:i+3], 16, 8)
			if err != nil {
				return "", false
			}
			b.WriteByte(byte(n))
			i += 2
		}
		return b.String(), true
	}
	names := []string{"", "unknown", "~unknown", "~", "~7E", "a.b", "a_b", "a*b", "a>b", "a b", "é", "__",
		"20261206t095319-7528df1bf6f3", "team-a", "Team_B", "\x00\xff", "job~2A0001"}
	seen := map[string]string{}
	for _, name := range names {
		tok := dlqToken(name)
		if back, ok := undo(tok); !ok || back != name {
			t.Errorf("dlqToken(%q) = %q, which reads back as %q", name, tok, back)
		}
		if other, dup := seen[tok]; dup {
			t.Errorf("%q and %q share the token %q", name, other, tok)
		}
		seen[tok] = name
		if tok == "" || strings.ContainsAny(tok, ".*> \t\r\n") || strings.ContainsFunc(tok, func(r rune) bool { return r > 0x7e }) {
			t.Errorf("dlqToken(%q) = %q is not one plain subject token", name, tok)
		}
	}
	for _, valid := range []string{"20261206t095319-7528df1bf6f3", "team-a", "default"} {
		if tok := dlqToken(valid); tok != valid {
			t.Errorf("dlqToken(%q) = %q; a valid name keeps its subject", valid, tok)
		}
	}
}
