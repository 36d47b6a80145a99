package egress

import (
	"fmt"
	"net/netip"
	"regexp"
	"slices"
	"strconv"
	"strings"
)

// Policy is what one job may reach, built by the caller from the job's profile. It is plain
// data; New validates it.
type Policy struct {
	// Allow lists the hosts the job may reach: "host" (any port), "host:port", "*.suffix"
	// (every name under suffix, not suffix itself) or "*.suffix:port". An IP literal entry
	// allows that address only (in any spelling); a name entry never matches an IP literal.
	// Empty means nothing is allowed.
	Allow []string
	// Secrets are the credentials the proxy injects. The sandbox sees a placeholder of the
	// same shape; the real value is sent only on TLS to the secret's Hosts.
	Secrets []Secret
	// profileAllow is the profile's Allow when Narrow put a job's own list in its place: an
	// exact host:port entry lifts the denial of a worker endpoint's host on that port only
	// when the operator's profile names it too, never because a job narrowed a wider entry
	// to it.
	profileAllow []string
	// held are the profile's secrets as the profile binds them, when Narrow dropped or
	// narrowed some: a host they are bound to may hold a value an earlier job sent it (a
	// request log, a stored field) and hand it back, so its answers are scrubbed of it
	// whatever the job's own list (heldBy).
	held []Secret
}

// Secret is one credential bound to hosts.
type Secret struct {
	// Env is the name of the sandbox variable that holds the placeholder, e.g. EXAMPLE_TOKEN.
	Env string
	// Value is the real value. It never leaves the proxy except in request headers sent on TLS
	// to Hosts, and never appears in an error, a decision, a log line or a metric.
	Value string
	// Hosts are the names (exact, or "*.suffix") the value is substituted for. Each must also
	// be allowed by Policy.Allow.
	Hosts []string
}

// rule is one parsed allow entry.
type rule struct {
	name     string     // exact name, or the suffix for a wildcard (without "*.")
	wildcard bool       // "*.suffix": matches names strictly under suffix
	addr     netip.Addr // set for an IP literal entry
	port     int        // 0 = any port
}

var (
	labelRE  = regexp.MustCompile(`^[a-z0-9_]([a-z0-9_-]{0,61}[a-z0-9_])?$`)
	envNameR = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)
)

// parseRule parses one allow entry.
func parseRule(entry string) (rule, error) {
	hostPart, port, err := splitEntry(entry)
	if err != nil {
		return rule{}, err
	}
	r := rule{port: port}
	if strings.HasPrefix(hostPart, "*.") {
		r.wildcard = true
		hostPart = hostPart[2:]
	}
	h, err := parseHost(hostPart)
	if err != nil {
		return rule{}, err
	}
	if h.isIP() {
		if r.wildcard {
			return rule{}, fmt.Errorf("%q: a wildcard needs a name, not an address", entry)
		}
		r.addr = h.addr
		return r, nil
	}
	if r.wildcard && !strings.Contains(h.name, ".") {
		return rule{}, fmt.Errorf("%q: a wildcard needs at least two labels after \"*.\" (e.g. *.example.com)", entry)
	}
	r.name = h.name
	return r, nil
}

// splitEntry splits "host[:port]" where host may be "[v6]".
func splitEntry(entry string) (string, int, error) {
	e := strings.TrimSpace(entry)
	if e == "" {
		return "", 0, fmt.Errorf("empty allow entry")
	}
	if strings.HasPrefix(e, "[") {
		end := strings.Index(e, "]")
		if end < 0 {
			return "", 0, fmt.Errorf("%q: unclosed '['", entry)
		}
		rest := e[end+1:]
		if rest == "" {
			return e, 0, nil
		}
		if !strings.HasPrefix(rest, ":") {
			return "", 0, fmt.Errorf("%q: expected ':port' after ']'", entry)
		}
		p, err := parsePort(rest[1:])
		return e[:end+1], p, err
	}
	if strings.Count(e, ":") > 1 { // a bare IPv6 literal
		return e, 0, nil
	}
	host, portStr, found := strings.Cut(e, ":")
	if !found {
		return e, 0, nil
	}
	p, err := parsePort(portStr)
	if err != nil {
		return "", 0, fmt.Errorf("%q: %w", entry, err)
	}
	return host, p, nil
}

func parsePort(s string) (int, error) {
	p, err := strconv.Atoi(s)
	if err != nil || p < 1 || p > 65535 || s[0] == '0' || s[0] == '+' {
		return 0, fmt.Errorf("port %q is not a number in 1-65535", s)
	}
	return p, nil
}

// match reports whether the rule allows host h on port.
func (r rule) match(h host, port int) bool {
	if r.port != 0 && r.port != port {
		return false
	}
	if r.addr.IsValid() || h.isIP() {
		return r.addr.IsValid() && h.isIP() && r.addr == h.addr
	}
	if r.wildcard {
		return strings.HasSuffix(h.name, "."+r.name)
	}
	return h.name == r.name
}

// compiledPolicy is a validated Policy.
type compiledPolicy struct {
	allow   []rule
	exact   []rule // the host:port entries of allow (no wildcard) the profile names as they are
	secrets []*secret
	// scrubOnly are the profile's secrets the job's list left bound nowhere: never swapped
	// in, but scrubbed from the answers of the hosts the profile binds them to (heldBy).
	scrubOnly []*secret
}

// compilePolicy validates the policy and generates a placeholder per secret.
func compilePolicy(p Policy) (*compiledPolicy, error) {
	cp := &compiledPolicy{}
	for _, e := range p.Allow {
		r, err := parseRule(e)
		if err != nil {
			return nil, fmt.Errorf("%w: allow: %w", ErrInvalidPolicy, err)
		}
		cp.allow = append(cp.allow, r)
	}
	cp.exact = exactRules(cp.allow, p.profileAllow)
	seen := map[string]bool{}
	for i, s := range p.Secrets {
		sec, err := compileSecret(s, cp.allow)
		if err != nil {
			return nil, fmt.Errorf("%w: secrets[%d]: %w", ErrInvalidPolicy, i, err)
		}
		if seen[sec.env] {
			return nil, fmt.Errorf("%w: secrets[%d]: env %s is bound twice; give each secret its own variable", ErrInvalidPolicy, i, sec.env)
		}
		seen[sec.env] = true
		cp.secrets = append(cp.secrets, sec)
	}
	if err := cp.compileHeld(p.held); err != nil {
		return nil, err
	}
	return cp, nil
}

// compileHeld gives each secret the hosts the profile binds it to, as held, and keeps the
// ones the job's list dropped as scrubOnly.
func (cp *compiledPolicy) compileHeld(held []Secret) error {
	for i, s := range held {
		var rules []rule
		for _, h := range s.Hosts {
			r, err := parseRule(h)
			if err != nil {
				return fmt.Errorf("%w: profile's secrets[%d]: %w", ErrInvalidPolicy, i, err)
			}
			rules = append(rules, r)
		}
		if j := slices.IndexFunc(cp.secrets, func(c *secret) bool { return c.env == s.Env }); j >= 0 {
			cp.secrets[j].held = rules
			continue
		}
		ph, err := placeholderFor(s.Value)
		if err != nil {
			return fmt.Errorf("%w: profile's secrets[%d]: %s: %w", ErrInvalidPolicy, i, s.Env, err)
		}
		cp.scrubOnly = append(cp.scrubOnly, &secret{env: s.Env, value: s.Value, placeholder: ph, held: rules})
	}
	return nil
}

// allowed reports whether any rule allows host h on port.
func (cp *compiledPolicy) allowed(h host, port int) bool {
	for _, r := range cp.allow {
		if r.match(h, port) {
			return true
		}
	}
	return false
}

// exactRules are the rules of allow that name one host on one port, and, when the profile's
// list is given (a job's list narrowed it), that the profile names just so.
func exactRules(allow []rule, profileAllow []string) []rule {
	var out []rule
	for _, r := range allow {
		if r.wildcard || r.port == 0 {
			continue
		}
		if profileAllow == nil || slices.ContainsFunc(profileAllow, func(e string) bool {
			o, err := parseRule(e)
			return err == nil && o == r
		}) {
			out = append(out, r)
		}
	}
	return out
}

// explicit reports whether an allow entry names exactly host h on port (exactRules): what
// lifts the denial of a worker endpoint's host on another port than the endpoint's.
func (cp *compiledPolicy) explicit(h host, port int) bool {
	return slices.ContainsFunc(cp.exact, func(r rule) bool { return r.match(h, port) })
}

// boundSecrets returns the secrets bound to host h on port.
func (cp *compiledPolicy) boundSecrets(h host, port int) []*secret {
	var out []*secret
	for _, s := range cp.secrets {
		for _, r := range s.hosts {
			if r.match(h, port) {
				out = append(out, s)
				break
			}
		}
	}
	return out
}

// heldBy returns the secrets the profile binds to host h on any port, the job's list aside:
// values h may have been sent on a terminated tunnel, of this job or an earlier one, and may
// hand back on any of its ports and schemes (stored echo). Its answers are scrubbed of them
// on every path.
func (cp *compiledPolicy) heldBy(h host) []*secret {
	var out []*secret
	for _, s := range slices.Concat(cp.secrets, cp.scrubOnly) {
		if slices.ContainsFunc(s.heldAt(), func(r rule) bool { r.port = 0; return r.match(h, 0) }) {
			out = append(out, s)
		}
	}
	return out
}
