package egress

import (
	"fmt"
	"math"
	"net/netip"
	"strconv"
	"strings"
)

// host is a normalised target: a lower-case name without a trailing dot, or an address. An IP
// literal in any spelling (dotted, decimal, octal, hex, short forms, bracketed IPv6) becomes an
// address, so it can never match a name rule.
type host struct {
	name string
	addr netip.Addr
}

func (h host) isIP() bool { return h.addr.IsValid() }

// String is the canonical form used in decisions and summaries.
func (h host) String() string {
	if h.isIP() {
		return h.addr.String()
	}
	return h.name
}

// hostField is the Host an upstream gets for h and port: the host and port the policy decided
// on, in the proxy's spelling, the port left out when it is the scheme's (defaultPort). Never
// the sandbox's spelling: a server or front end that routes by the Host string takes
// "API.Example.COM." or "api.example.com:443" for another site than "api.example.com", and the
// request, a swapped secret with it, would go there (TestUpstreamGetsTheHostDecided).
func (h host) hostField(port, defaultPort int) string {
	s := h.String()
	if h.addr.Is6() {
		s = "[" + s + "]"
	}
	if port != defaultPort {
		s += ":" + strconv.Itoa(port)
	}
	return s
}

// parseHost normalises a host as it appears in a request target, a Host header, an SNI or an
// allow entry.
func parseHost(s string) (host, error) {
	if strings.HasPrefix(s, "[") {
		if !strings.HasSuffix(s, "]") {
			return host{}, fmt.Errorf("host %q: unclosed '['", s)
		}
		s = s[1 : len(s)-1]
		a, err := netip.ParseAddr(s)
		if err != nil || !a.Is6() || a.Zone() != "" {
			return host{}, fmt.Errorf("host %q: not an IPv6 address without a zone", s)
		}
		return host{addr: a.Unmap()}, nil
	}
	if strings.Contains(s, ":") {
		a, err := netip.ParseAddr(s)
		if err != nil || a.Zone() != "" {
			return host{}, fmt.Errorf("host %q: not an address or a name", s)
		}
		return host{addr: a.Unmap()}, nil
	}
	name := strings.TrimSuffix(strings.ToLower(s), ".")
	if name == "" || len(name) > 253 {
		return host{}, fmt.Errorf("host %q: empty or longer than 253 bytes", s)
	}
	labels := strings.Split(name, ".")
	if looksNumeric(labels[len(labels)-1]) {
		a, ok := parseIPv4Loose(labels)
		if !ok {
			return host{}, fmt.Errorf("host %q: ends in a number but is not an IPv4 address", s)
		}
		return host{addr: a}, nil
	}
	for _, l := range labels {
		if !labelRE.MatchString(l) {
			return host{}, fmt.Errorf("host %q: label %q is not a DNS label (letters, digits, '-', '_'; punycode for other scripts)", s, l)
		}
	}
	return host{name: name}, nil
}

// looksNumeric reports whether a label is a number in the inet_aton sense (decimal, 0-octal or
// 0x-hex): WHATWG URL parsing treats a host whose last label is one as an IPv4 address, and so
// do the C resolvers behind curl and python.
func looksNumeric(l string) bool {
	if l == "" {
		return false
	}
	if strings.HasPrefix(l, "0x") || strings.HasPrefix(l, "0X") {
		for _, c := range l[2:] {
			if !strings.ContainsRune("0123456789abcdefABCDEF", c) {
				return false
			}
		}
		return true
	}
	for _, c := range l {
		if c < '0' || c > '9' {
			return false
		}
	}
	return true
}

// parseIPv4Loose parses 1-4 inet_aton parts: "2130706433", "0x7f.1", "0177.0.0.1", "127.1".
func parseIPv4Loose(parts []string) (netip.Addr, bool) {
	if len(parts) > 4 {
		return netip.Addr{}, false
	}
	vals := make([]uint64, len(parts))
	for i, p := range parts {
		v, ok := parseNumber(p)
		if !ok {
			return netip.Addr{}, false
		}
		vals[i] = v
	}
	var ip uint64
	for i, v := range vals[:len(vals)-1] {
		if v > 255 {
			return netip.Addr{}, false
		}
		ip |= v << (24 - 8*uint(i))
	}
	last := vals[len(vals)-1]
	if last >= 1<<(8*uint(5-len(vals))) || last > math.MaxUint32 {
		return netip.Addr{}, false
	}
	ip |= last
	return netip.AddrFrom4([4]byte{byte(ip >> 24), byte(ip >> 16), byte(ip >> 8), byte(ip)}), true
}

func parseNumber(p string) (uint64, bool) {
	base := 10
	switch {
	case strings.HasPrefix(p, "0x") || strings.HasPrefix(p, "0X"):
		base, p = 16, p[2:]
		if p == "" {
			return 0, true
		}
	case len(p) > 1 && p[0] == '0':
		base, p = 8, p[1:]
	}
	if p == "" {
		return 0, false
	}
	v, err := strconv.ParseUint(p, base, 64)
	return v, err == nil
}

// splitHostPort splits an authority "host:port" (port required) and normalises the host.
func splitHostPort(authority string, defaultPort int) (host, int, error) {
	hs, ps := authority, ""
	if i := strings.LastIndex(authority, ":"); i >= 0 && !strings.HasSuffix(authority, "]") {
		hs, ps = authority[:i], authority[i+1:]
	}
	port := defaultPort
	if ps != "" || strings.HasSuffix(authority, ":") {
		p, err := parsePort(ps)
		if err != nil {
			return host{}, 0, fmt.Errorf("authority %q: %w", authority, err)
		}
		port = p
	}
	if port == 0 {
		return host{}, 0, fmt.Errorf("authority %q: a port is required", authority)
	}
	h, err := parseHost(hs)
	return h, port, err
}
