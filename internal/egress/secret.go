package egress

import (
	"crypto/rand"
	"fmt"
	"math/big"
	"strings"
)

// secret is a compiled Secret: the real value, its placeholder and the hosts it is bound to.
type secret struct {
	env         string
	value       string
	placeholder string
	hosts       []rule // where it is swapped in
	held        []rule // where the profile binds it, when the job's list narrowed hosts
}

// heldAt is where the profile binds s: hosts that may hold its value (compiledPolicy.heldBy).
func (s *secret) heldAt() []rule {
	if s.held != nil {
		return s.held
	}
	return s.hosts
}

// minRandomChars is the fewest letters and digits a value may have: its placeholder keeps the
// value's punctuation and replaces each letter and digit, so fewer would make a guessable
// placeholder (and a likely collision with ordinary header text).
const minRandomChars = 12

func compileSecret(s Secret, allow []rule) (*secret, error) {
	if !envNameR.MatchString(s.Env) {
		return nil, fmt.Errorf("env %q is not a variable name ([A-Za-z_][A-Za-z0-9_]*)", s.Env)
	}
	if len(s.Hosts) == 0 {
		return nil, fmt.Errorf("%s: no hosts; a secret must be bound to at least one host", s.Env)
	}
	sec := &secret{env: s.Env, value: s.Value}
	for _, h := range s.Hosts {
		r, err := parseRule(h)
		if err != nil {
			return nil, fmt.Errorf("%s: hosts: %w", s.Env, err)
		}
		if !ruleCovered(r, allow) {
			return nil, fmt.Errorf("%s: host %q is not in network.allow; add it there too", s.Env, h)
		}
		sec.hosts = append(sec.hosts, r)
	}
	if strings.ContainsAny(s.Value, "\r\n\x00") {
		return nil, fmt.Errorf("%s: %w: it contains CR, LF or NUL and cannot be sent in a header", s.Env, ErrSecretValue)
	}
	ph, err := placeholderFor(s.Value)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", s.Env, err)
	}
	sec.placeholder = ph
	return sec, nil
}

// ruleCovered reports whether a secret's host rule names hosts some allow rule names. Ports are
// not compared: a secret is only ever swapped on a connection the allowlist let through.
func ruleCovered(r rule, allow []rule) bool {
	for _, a := range allow {
		switch {
		case r.addr.IsValid():
			if a.addr == r.addr {
				return true
			}
		case a.wildcard:
			if strings.HasSuffix(r.name, "."+a.name) || (r.wildcard && r.name == a.name) {
				return true
			}
		case !r.wildcard && a.name == r.name:
			return true
		}
	}
	return false
}

// placeholderFor returns a random string of the value's shape: same length, each lower-case
// letter, upper-case letter and digit replaced by a random one of its class, everything else
// kept (so "sk-live-..." prefixes and separators survive clients that check them). It never
// equals the value.
func placeholderFor(value string) (string, error) {
	n := 0
	for _, c := range value {
		if classOf(c) != "" {
			n++
		}
	}
	if n < minRandomChars {
		return "", fmt.Errorf("%w: it has %d letters and digits, fewer than %d: too short to stand in for safely", ErrSecretValue, n, minRandomChars)
	}
	for {
		var b strings.Builder
		for _, c := range value {
			class := classOf(c)
			if class == "" {
				b.WriteRune(c)
				continue
			}
			i, err := rand.Int(rand.Reader, big.NewInt(int64(len(class))))
			if err != nil {
				return "", fmt.Errorf("placeholder: %w", err)
			}
			b.WriteByte(class[i.Int64()])
		}
		if ph := b.String(); ph != value {
			return ph, nil
		}
	}
}

func classOf(c rune) string {
	switch {
	case c >= 'a' && c <= 'z':
		return "abcdefghijklmnopqrstuvwxyz"
	case c >= 'A' && c <= 'Z':
		return "ABCDEFGHIJKLMNOPQRSTUVWXYZ"
	case c >= '0' && c <= '9':
		return "0123456789"
	}
	return ""
}
