package egress

import (
	"errors"
	"fmt"
	"slices"
	"strconv"
)

// ErrWiden marks a job's own allowlist that names a host or port its profile's does not allow:
// a job may narrow its profile's network, never widen it.
var ErrWiden = errors.New("egress: the job's network is wider than its profile's")

// Narrow returns p with allow, a job's own allowlist, in place of p.Allow. Each entry of allow
// must name only hosts and ports some entry of p.Allow allows ("api.example.com:443" narrows
// "*.example.com"; "*.example.com" does not narrow "api.example.com"), else the error wraps
// ErrWiden; an entry that is no allow entry at all wraps ErrInvalidPolicy. A secret keeps the
// hosts allow still covers, and one left with none is dropped: its variable is not set, and
// its value goes nowhere.
func Narrow(p Policy, allow []string) (Policy, error) {
	var outer []rule
	for _, e := range p.Allow {
		r, err := parseRule(e)
		if err != nil {
			return Policy{}, fmt.Errorf("%w: profile's allow: %w", ErrInvalidPolicy, err)
		}
		outer = append(outer, r)
	}
	var inner []rule
	for _, e := range allow {
		r, err := parseRule(e)
		if err != nil {
			return Policy{}, fmt.Errorf("%w: job's allow: %w", ErrInvalidPolicy, err)
		}
		if !narrows(r, outer) {
			return Policy{}, fmt.Errorf("%w: %q is not within the profile's allow list %q", ErrWiden, e, p.Allow)
		}
		inner = append(inner, r)
	}
	out := Policy{Allow: append([]string{}, allow...), profileAllow: p.profileAllow, held: p.held}
	if out.profileAllow == nil {
		out.profileAllow = append([]string{}, p.Allow...)
	}
	if out.held == nil {
		out.held = slices.Clone(p.Secrets)
	}
	for _, s := range p.Secrets {
		kept := s
		kept.Hosts = narrowHosts(s.Hosts, inner)
		if len(kept.Hosts) > 0 {
			out.Secrets = append(out.Secrets, kept)
		}
	}
	return out, nil
}

// narrows reports whether some rule of outer allows every host and port r allows.
func narrows(r rule, outer []rule) bool {
	for _, o := range outer {
		if (o.port == 0 || o.port == r.port) && ruleCovered(r, []rule{o}) {
			return true
		}
	}
	return false
}

// narrowHosts is what is left of a secret's hosts under the job's allow rules: a host they
// still cover stays as it is; one that covers a rule's name gives way to that name ("*.example.com"
// under "api.example.com" becomes "api.example.com"), on the secret host's own port
// ("*.example.com:443" becomes "api.example.com:443"). Narrowing never widens a binding: a
// host keeps its port, and one whose port no rule allows goes.
func narrowHosts(hosts []string, inner []rule) []string {
	var out []string
	for _, h := range hosts {
		r, err := parseRule(h)
		if err != nil {
			continue
		}
		if slices.ContainsFunc(inner, func(a rule) bool { return samePort(r, a) && ruleCovered(r, []rule{a}) }) {
			out = append(out, h)
			continue
		}
		for _, a := range inner {
			n := rule{name: a.name, wildcard: a.wildcard, addr: a.addr, port: r.port}
			if samePort(r, a) && ruleCovered(rule{name: a.name, wildcard: a.wildcard, addr: a.addr}, []rule{r}) && !slices.Contains(out, n.String()) {
				out = append(out, n.String())
			}
		}
	}
	return out
}

// samePort reports whether some port is allowed by both rules.
func samePort(a, b rule) bool {
	return a.port == 0 || b.port == 0 || a.port == b.port
}

// String is the rule as an allow entry: its host, and its port if it has one.
func (r rule) String() string {
	h := r.hostName()
	if r.port == 0 {
		return h
	}
	if r.addr.Is6() {
		h = "[" + h + "]"
	}
	return h + ":" + strconv.Itoa(r.port)
}

// hostName is the rule's host as an allow entry, without its port.
func (r rule) hostName() string {
	switch {
	case r.addr.IsValid():
		return r.addr.String()
	case r.wildcard:
		return "*." + r.name
	}
	return r.name
}
