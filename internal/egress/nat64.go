package egress

import (
	"context"
	"log/slog"
	"net/netip"
	"slices"
)

// ipv4onlyArpa is the name whose only addresses are the well-known 192.0.0.170 and .171: a
// DNS64 answers its AAAA query with them under the network's NAT64 prefix (RFC 7050).
const ipv4onlyArpa = "ipv4only.arpa."

var wellKnownV4 = []netip.Addr{netip.MustParseAddr("192.0.0.170"), netip.MustParseAddr("192.0.0.171")}

// WarnUnlistedNAT64 asks the proxy's resolver for ipv4only.arpa and warns, naming
// egress.nat64_prefixes, of each NAT64 prefix its answer shows that the config does not list:
// an address in such a prefix is checked only as the IPv6 address it is, not by the IPv4
// address its gateway reaches. The prefix is not taken from the answer: the address table is
// what the config says, the same on every worker whatever resolver each asks. No answer (no
// DNS64, which is the common case) says nothing.
func WarnUnlistedNAT64(ctx context.Context, cfg Config, log *slog.Logger) {
	cfg = cfg.withDefaults()
	ctx, cancel := context.WithTimeout(ctx, cfg.Limits.DialTimeout)
	defer cancel()
	addrs, err := cfg.Resolver.LookupNetIP(ctx, "ip6", ipv4onlyArpa)
	if err != nil {
		return
	}
	for _, p := range unlistedNAT64(addrs, cfg.NAT64Prefixes) {
		log.WarnContext(ctx, "egress: the resolver's DNS64 synthesizes addresses under a NAT64 prefix the config does not list; an address in it is not checked by the IPv4 address it carries: add the prefix to the setting",
			"prefix", p.String(), "setting", "egress.nat64_prefixes")
	}
}

// unlistedNAT64 is each prefix, of the lengths RFC 6052 defines, under which an address of
// addrs carries a well-known address of ipv4only.arpa, that neither listed nor the built-in
// ranges read the IPv4 address of.
func unlistedNAT64(addrs []netip.Addr, listed []netip.Prefix) []netip.Prefix {
	var out []netip.Prefix
	for _, a := range addrs {
		if !a.Is6() || a.Is4In6() {
			continue
		}
		for _, bits := range nat64Lengths {
			p, _ := a.Prefix(bits)
			if !slices.Contains(wellKnownV4, nat64Embedded(a, bits)) || slices.Contains(out, p) ||
				slices.ContainsFunc(listed, func(l netip.Prefix) bool { return l.Masked() == p }) || bits == 96 && (nat64Prefix.Contains(a) || nat64LocalPfx.Contains(a)) {
				continue
			}
			out = append(out, p)
		}
	}
	return out
}
