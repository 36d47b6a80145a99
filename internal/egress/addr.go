package egress

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strconv"
)

// rangeRule is one row of the built-in address table.
type rangeRule struct {
	prefix netip.Prefix
	hard   bool // never lifted by Config.AllowedCIDRs
	what   string
}

// builtinRanges are denied whatever the allowlist says. Hard rows reach the host itself or its
// neighbours (loopback, link-local and cloud metadata, multicast); soft rows are networks an
// operator may open with AllowedCIDRs (a private mirror; the tests' 198.18.0.0/15).
var builtinRanges = func() []rangeRule {
	rows := []struct {
		cidr string
		hard bool
		what string
	}{
		{"0.0.0.0/8", true, "this network (RFC 1122)"},
		{"127.0.0.0/8", true, "loopback"},
		{"169.254.0.0/16", true, "link-local and cloud metadata"},
		{"224.0.0.0/4", true, "multicast"},
		{"255.255.255.255/32", true, "broadcast"},
		{"::/128", true, "unspecified"},
		{"::1/128", true, "loopback"},
		{"fe80::/10", true, "link-local"},
		{"ff00::/8", true, "multicast"},
		// Cloud metadata and platform endpoints outside link-local: they sit in ranges an
		// operator lifts (GCP's internal IPv6 is fd20::/20, CGNAT carries pod networks) or in
		// public space, and hand out instance credentials whatever range they are in.
		{"fd00:ec2::254/128", true, "cloud metadata (AWS IPv6)"},
		{"fd20:ce::254/128", true, "cloud metadata (GCP IPv6)"},
		{"100.100.100.200/32", true, "cloud metadata (Alibaba Cloud)"},
		{"168.63.129.16/32", true, "cloud platform endpoint (Azure WireServer)"},
		{"10.0.0.0/8", false, "private (RFC 1918)"},
		{"172.16.0.0/12", false, "private (RFC 1918)"},
		{"192.168.0.0/16", false, "private (RFC 1918)"},
		{"100.64.0.0/10", false, "shared address space (CGNAT, RFC 6598)"},
		{"192.0.0.0/24", false, "IETF protocol assignments"},
		{"192.0.2.0/24", false, "documentation (TEST-NET-1)"},
		{"198.51.100.0/24", false, "documentation (TEST-NET-2)"},
		{"203.0.113.0/24", false, "documentation (TEST-NET-3)"},
		{"198.18.0.0/15", false, "benchmarking (RFC 2544)"},
		{"192.88.99.0/24", false, "6to4 relay anycast"},
		{"240.0.0.0/4", false, "reserved"},
		{"::/96", false, "IPv4-compatible IPv6"},
		{"::ffff:0:0:0/96", false, "IPv4-translated IPv6 (SIIT)"},
		{"100::/64", false, "discard-only"},
		{"64:ff9b::/96", false, "NAT64"},
		{"64:ff9b:1::/48", false, "local NAT64"},
		{"2001::/23", false, "IETF protocol assignments (Teredo, benchmarking, ORCHID)"},
		{"2001:db8::/32", false, "documentation"},
		{"3fff::/20", false, "documentation"},
		{"2002::/16", false, "6to4"},
		{"fc00::/7", false, "unique local"},
		{"fec0::/10", false, "site-local"},
	}
	out := make([]rangeRule, len(rows))
	for i, r := range rows {
		out[i] = rangeRule{prefix: netip.MustParsePrefix(r.cidr), hard: r.hard, what: r.what}
	}
	return out
}()

// addrFilter decides whether an address may be dialled.
type addrFilter struct {
	denied    []netip.Prefix // Config.DeniedCIDRs
	allowed   []netip.Prefix // Config.AllowedCIDRs
	hostAddrs map[netip.Addr]bool
	endpoints map[netip.AddrPort]bool
	epNames   map[string]bool // "name:port" of worker endpoints given by name
	// The endpoints' hosts, by name and address: denied on every other port too, unless an
	// allow entry names exactly that host and port (compiledPolicy.explicit). A NATS host's
	// monitoring port (8222), a store's console, a model server's metrics are the worker's.
	epHosts map[string]bool
	epAddrs map[netip.Addr]bool
	nat64   []netip.Prefix // Config.NAT64Prefixes
}

func newAddrFilter(cfg Config) (*addrFilter, error) {
	f := &addrFilter{denied: withIPv4Forms(unmapPrefixes(cfg.DeniedCIDRs), cfg.NAT64Prefixes), allowed: unmapPrefixes(cfg.AllowedCIDRs), nat64: cfg.NAT64Prefixes,
		hostAddrs: map[netip.Addr]bool{}, endpoints: map[netip.AddrPort]bool{}, epNames: map[string]bool{},
		epHosts: map[string]bool{}, epAddrs: map[netip.Addr]bool{}}
	for _, a := range cfg.HostAddrs {
		for _, k := range f.hostKeys(a) {
			f.hostAddrs[k] = true
		}
	}
	ifaddrs, err := net.InterfaceAddrs()
	if err != nil {
		return nil, fmt.Errorf("egress: list the host's addresses: %w", err)
	}
	for _, ia := range ifaddrs {
		if p, err := netip.ParsePrefix(ia.String()); err == nil {
			for _, k := range f.hostKeys(p.Addr()) {
				f.hostAddrs[k] = true
			}
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), cfg.Limits.DialTimeout)
	defer cancel()
	for _, ep := range cfg.WorkerEndpoints {
		if err := f.addEndpoint(ctx, cfg.Resolver, ep); err != nil {
			return nil, err
		}
	}
	return f, nil
}

// unmapPrefixes writes each prefix inside ::ffff:0:0/96 (IPv4-mapped, "::ffff:10.0.0.0/104")
// as the IPv4 prefix it is: check reads a mapped address as its IPv4 address, so a denied
// CIDR written mapped matched no address at all, and an allowed one lifted none.
func unmapPrefixes(ps []netip.Prefix) []netip.Prefix {
	out := make([]netip.Prefix, 0, len(ps))
	for _, p := range ps {
		if p.Addr().Is4In6() && p.Bits() >= 96 {
			p = netip.PrefixFrom(p.Addr().Unmap(), p.Bits()-96).Masked()
		}
		out = append(out, p)
	}
	return out
}

// withIPv4Forms adds, for each prefix inside a NAT64 prefix (nat64Layouts: a /96 form whose
// last 32 bits are an IPv4 address, a prefix of nat64), the IPv4 prefix its bits cover where
// RFC 6052 puts the address under that prefix (ipv4Covered): a denied 64:ff9b::c613:0/112, as
// a DNS64 network writes 198.19.0.0/16, denied the NAT64 form alone and left the same servers
// open at their IPv4 addresses (TestAddrFilterComparesByServer). One that covers no IPv4 bit
// (a whole /96, or the u octet of a /64) is the form itself, and denies that form alone:
// widened, a denied 64:ff9b::/96 denied 0.0.0.0/0, every IPv4 address
// (TestDeniedNAT64PrefixDeniesItsFormsAlone). Read as a /96 inside a local-use /64 of nat64,
// a denied /97 there denied 0.0.0.0/1 (TestDeniedNAT64PrefixDeniesItsIPv4Prefix). Allowed
// CIDRs are not widened so: an address in a NAT64 form is lifted by both its own and its IPv4
// prefix (check).
func withIPv4Forms(ps, nat64 []netip.Prefix) []netip.Prefix {
	out := slices.Clone(ps)
	for _, p := range ps {
		p = p.Masked()
		if !p.Addr().Is6() {
			continue
		}
		for _, bits := range nat64Layouts(p.Addr(), nat64) {
			if v4, ok := ipv4Covered(p, bits); ok {
				out = append(out, v4)
			}
		}
	}
	return out
}

// ipv4Covered is the IPv4 prefix that p, inside a NAT64 prefix of length bits, covers: the
// IPv4 address under it (nat64Embedded) up to p's last bit. ok is false when p fixes no bit of
// the address.
func ipv4Covered(p netip.Prefix, bits int) (netip.Prefix, bool) {
	n := 0
	for pos, left := bits, 32; left > 0 && pos < p.Bits(); pos++ {
		if pos >= 64 && pos < 72 { // the u octet (RFC 6052 2.2)
			continue
		}
		n, left = n+1, left-1
	}
	return netip.PrefixFrom(nat64Embedded(p.Addr(), bits), n).Masked(), n > 0
}

// nat64Layouts are the lengths of the NAT64 prefixes a is in, under which it carries an IPv4
// address as RFC 6052 puts it: each prefix of nat64 (the network's own) that holds a, and 96
// for IPv4-compatible, IPv4-translated and 64:ff9b::/96 addresses, and for one of the
// local-use 64:ff9b:1::/48 that no prefix of nat64 holds. A prefix of the network's inside
// the local-use range says how it is laid out there: read as a /96 besides, an address of a
// local-use /64 carried its last 32 bits as an address (198.19.0.0 under a /64 was refused as
// 0.0.0.0, TestDeniedNAT64PrefixDeniesItsIPv4Prefix).
func nat64Layouts(a netip.Addr, nat64 []netip.Prefix) []int {
	var out []int
	for _, p := range nat64 {
		if p.Contains(a) && !slices.Contains(out, p.Bits()) {
			out = append(out, p.Bits())
		}
	}
	switch {
	case compatPrefix.Contains(a), siitPrefix.Contains(a), nat64Prefix.Contains(a),
		nat64LocalPfx.Contains(a) && len(out) == 0:
		if !slices.Contains(out, 96) {
			out = append(out, 96)
		}
	}
	return out
}

// addEndpoint denies a worker endpoint by name and by every address the name has now.
func (f *addrFilter) addEndpoint(ctx context.Context, r Resolver, ep string) error {
	hs, ps, _ := net.SplitHostPort(ep) // validated by Config.validate
	port, err := strconv.Atoi(ps)
	if err != nil || port < 1 || port > 65535 {
		return fmt.Errorf("%w: worker endpoint %q: bad port", ErrInvalidConfig, ep)
	}
	h, err := parseHost(hs)
	if err != nil {
		return fmt.Errorf("%w: worker endpoint %q: %w", ErrInvalidConfig, ep, err)
	}
	if h.isIP() {
		f.addEndpointAddr(h.addr, port)
		return nil
	}
	f.epNames[net.JoinHostPort(h.name, ps)] = true
	f.epHosts[h.name] = true
	addrs, err := r.LookupNetIP(ctx, "ip", h.name)
	if err != nil {
		// The name stays denied; its addresses are denied again at dial time when they fall
		// in a built-in range (they usually do: the worker's endpoints are internal).
		return nil
	}
	for _, a := range addrs {
		f.addEndpointAddr(a, port)
	}
	return nil
}

// addEndpointAddr denies an endpoint's address under every form of it that reaches its
// server (servers): the NAT64 form a DNS64 resolver gave the worker is the IPv4 address a
// sandbox may ask for by another name.
func (f *addrFilter) addEndpointAddr(a netip.Addr, port int) {
	for _, k := range f.hostKeys(a) {
		f.endpoints[netip.AddrPortFrom(k, uint16(port))] = true
		f.epAddrs[k] = true
	}
}

// Details of a worker_endpoint refusal: the endpoint itself is never reached; another port of
// its host is, through an allow entry of exactly that host and port, which the refusal names.
const (
	detailEndpoint     = "the worker's own endpoint; never reachable through the proxy"
	detailEndpointHost = "a host of the worker's own endpoints (NATS, store, model); to reach it on this port, " +
		"name exactly %s in the profile's network.allow"
)

// checkName refuses a worker endpoint asked for by name, and another port of its host unless
// explicit (an allow entry names exactly that host and port).
func (f *addrFilter) checkName(h host, port int, explicit bool) (Reason, string) {
	if h.isIP() {
		return "", ""
	}
	if f.epNames[net.JoinHostPort(h.name, strconv.Itoa(port))] {
		return ReasonWorkerEndpoint, detailEndpoint
	}
	if f.epHosts[h.name] && !explicit {
		return ReasonWorkerEndpoint, fmt.Sprintf(detailEndpointHost, net.JoinHostPort(h.name, strconv.Itoa(port)))
	}
	return "", ""
}

// check returns "" when a may be dialled on port, or the reason and a short detail; explicit
// says an allow entry names the host asked for on exactly this port, which alone lets an
// address of a worker endpoint's host through on another port than the endpoint's. as is the
// host as asked for, for the refusal. Every address of the server a reaches must pass
// (servers): an IPv6 address in a lifted NAT64 range still reaches the IPv4 address it
// carries.
func (f *addrFilter) check(a netip.Addr, port int, explicit bool, as string) (Reason, string) {
	for i, k := range f.servers(a) {
		reason, detail := f.checkOne(k, port, explicit, as)
		if reason == "" {
			continue
		}
		if i > 0 {
			detail = "embeds " + k.String() + ": " + detail
		}
		return reason, detail
	}
	return "", ""
}

// checkOne is check for one address, as it is.
func (f *addrFilter) checkOne(a netip.Addr, port int, explicit bool, as string) (Reason, string) {
	if f.endpoints[netip.AddrPortFrom(a, uint16(port))] {
		return ReasonWorkerEndpoint, detailEndpoint
	}
	if f.epAddrs[a] && !explicit {
		return ReasonWorkerEndpoint, fmt.Sprintf(detailEndpointHost, net.JoinHostPort(as, strconv.Itoa(port)))
	}
	if f.hostAddrs[a] {
		return ReasonDeniedAddress, "an address of this host"
	}
	for _, p := range f.denied {
		if p.Contains(a) {
			return ReasonDeniedAddress, "in a denied CIDR of the worker's config"
		}
	}
	for _, r := range builtinRanges {
		if r.prefix.Contains(a) && (r.hard || !f.lifted(a)) {
			return ReasonDeniedAddress, r.what
		}
	}
	return "", ""
}

func (f *addrFilter) lifted(a netip.Addr) bool {
	for _, p := range f.allowed {
		if p.Contains(a) {
			return true
		}
	}
	return false
}

// servers is a, without a zone and with an IPv4-mapped address as the IPv4 address it is,
// followed by every IPv4 address it carries (embedded): the keys of the servers a reaches.
// Two addresses that share a key reach one server, so every address the proxy compares (held
// addresses, and by hostKeys the worker's endpoints and the host's own) is indexed and looked
// up by them: the same server at 198.18.0.10 and at 64:ff9b::198.18.0.10 was two to the
// proxy, one held and the other not (TestStoredEchoIsScrubbedUnderEveryFormOfItsAddress).
func (f *addrFilter) servers(a netip.Addr) []netip.Addr {
	a = a.Unmap().WithZone("")
	return append([]netip.Addr{a}, f.embedded(a)...)
}

// hostKeys are the keys of the host that has address a (this one, a worker endpoint's):
// servers, but for a Teredo address's server, a third party's host the address names as the
// one its client qualified with (RFC 4380), which check still refuses a Teredo address by.
// Keyed by it, this host's Teredo address had the server refused as this host
// (TestHostsTeredoServerIsNotTheHost).
func (f *addrFilter) hostKeys(a netip.Addr) []netip.Addr {
	ks := f.servers(a)
	if b := ks[0].As16(); ks[0].Is6() && b[0] == 0x20 && b[1] == 0x01 && b[2] == 0 && b[3] == 0 {
		server := v4At(b, 4)
		ks = append(ks[:1], slices.DeleteFunc(ks[1:], func(k netip.Addr) bool { return k == server })...)
	}
	return ks
}

// embedded is every IPv4 address a carries: where RFC 6052 puts it under each NAT64 prefix
// a is in (nat64Layouts), the built-in ones and the network's own, and in the other forms that
// carry one (embeddedIPv4).
func (f *addrFilter) embedded(a netip.Addr) []netip.Addr {
	var out []netip.Addr
	for _, bits := range nat64Layouts(a, f.nat64) {
		out = append(out, nat64Embedded(a, bits))
	}
	return append(out, embeddedIPv4(a)...)
}

// nat64Lengths are the prefix lengths RFC 6052 defines an embedding for.
var nat64Lengths = []int{32, 40, 48, 56, 64, 96}

// checkNAT64Prefix refuses a NAT64 prefix RFC 6052 gives no embedding for.
func checkNAT64Prefix(p netip.Prefix) error {
	if !p.Addr().Is6() || p.Addr().Is4In6() || !slices.Contains(nat64Lengths, p.Bits()) {
		return fmt.Errorf("NAT64 prefix %s: want an IPv6 prefix of length 32, 40, 48, 56, 64 or 96 (RFC 6052)", p)
	}
	return nil
}

// nat64Embedded is the IPv4 address in a under a NAT64 prefix of bits (RFC 6052 2.2): the 32
// bits after the prefix, skipping bits 64 to 71 (the "u" octet).
func nat64Embedded(a netip.Addr, bits int) netip.Addr {
	b := a.As16()
	var v4 [4]byte
	i := bits / 8
	for n := range v4 {
		if i == 8 {
			i++
		}
		v4[n] = b[i]
		i++
	}
	return netip.AddrFrom4(v4)
}

// The IPv6 ranges whose last 32 bits are an IPv4 address.
var (
	compatPrefix  = netip.MustParsePrefix("::/96")
	siitPrefix    = netip.MustParsePrefix("::ffff:0:0:0/96")
	nat64Prefix   = netip.MustParsePrefix("64:ff9b::/96")
	nat64LocalPfx = netip.MustParsePrefix("64:ff9b:1::/48")
)

// embeddedIPv4 returns the IPv4 addresses an IPv6 address carries in the forms that reach them
// besides the NAT64 ones (nat64Layouts: IPv4-compatible ::a.b.c.d, IPv4-translated
// ::ffff:0:a.b.c.d, which a stateless translator turns into a.b.c.d, NAT64's 64:ff9b::/96 and
// 64:ff9b:1::/48, the network's own prefixes): 6to4 (2002:AABB:CCDD::), Teredo
// (2001:0::/32: server, and the client XOR 0xffffffff) and, under any prefix, an ISATAP
// interface id (RFC 5214: 0000:5efe:a.b.c.d, with the u and g bits in 0200, 0100), which a host
// with an ISATAP interface on that prefix sends to a.b.c.d over IPv4. IPv4-mapped addresses
// (::ffff:a.b.c.d) are the IPv4 address itself (check unmaps them).
func embeddedIPv4(a netip.Addr) []netip.Addr {
	if !a.Is6() {
		return nil
	}
	b := a.As16()
	var out []netip.Addr
	switch {
	case b[0] == 0x20 && b[1] == 0x02:
		out = append(out, v4At(b, 2))
	case b[0] == 0x20 && b[1] == 0x01 && b[2] == 0 && b[3] == 0:
		client := v4At(b, 12).As4()
		out = append(out, v4At(b, 4), netip.AddrFrom4([4]byte{^client[0], ^client[1], ^client[2], ^client[3]}))
	}
	// ISATAP's id is the interface id of any prefix, so it is read besides the forms above
	// (a 6to4 prefix with an ISATAP id carries two addresses).
	if b[8]&^0x03 == 0 && b[9] == 0 && b[10] == 0x5e && b[11] == 0xfe {
		out = append(out, v4At(b, 12))
	}
	return out
}

// v4At is the IPv4 address in the four bytes of b from i.
func v4At(b [16]byte, i int) netip.Addr {
	return netip.AddrFrom4([4]byte{b[i], b[i+1], b[i+2], b[i+3]})
}
