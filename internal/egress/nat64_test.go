package egress

import (
	"bytes"
	"context"
	"log/slog"
	"math/rand/v2"
	"net/netip"
	"strings"
	"testing"
)

// TestWarnUnlistedNAT64: a resolver that synthesizes AAAA answers for ipv4only.arpa (RFC 7050)
// shows the network's NAT64 prefix; one egress.nat64_prefixes does not list gets a warning
// that names the prefix and the setting, as an address in it is checked only as the IPv6
// address it is. The prefix is not taken from the answer: the table is what the config says.
func TestWarnUnlistedNAT64(t *testing.T) {
	tests := []struct {
		name       string
		answers    []string // the resolver's answer for ipv4only.arpa; nil: no such name
		configured []string
		want       []string // the prefixes warned about
	}{
		{"no DNS64", nil, nil, nil},
		{"only the A records", []string{"192.0.0.170", "192.0.0.171"}, nil, nil},
		{"the well-known prefix", []string{"64:ff9b::c000:aa", "64:ff9b::c000:ab"}, nil, nil},
		{"a global /96", []string{"2600:1f00:64::c000:aa", "2600:1f00:64::c000:ab"}, nil, []string{"2600:1f00:64::/96"}},
		{"a global /96, listed", []string{"2600:1f00:64::c000:aa"}, []string{"2600:1f00:64::/96"}, nil},
		{"a /64 in the local-use range", []string{"64:ff9b:1:ab:c0:0:aa00:0"}, nil, []string{"64:ff9b:1:ab::/64"}},
		{"a /64 listed as another /64", []string{"64:ff9b:1:ab:c0:0:aa00:0"}, []string{"64:ff9b:1:ac::/64"}, []string{"64:ff9b:1:ab::/64"}},
		{"a /32", []string{"2600:1f00:c000:aa::"}, nil, []string{"2600:1f00::/32"}},
		{"a /48", []string{"2600:1f00:64:c000:0:aa00::"}, nil, []string{"2600:1f00:64::/48"}},
		{"a /40", []string{"2600:1f00:64c0:0:aa::"}, nil, []string{"2600:1f00:6400::/40"}},
		{"a /56", []string{"2600:1f00:64:1c0:0:aa::"}, nil, []string{"2600:1f00:64:100::/56"}},
		{"no well-known address in it", []string{"2600:1f00:64::1"}, nil, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := &stubResolver{names: map[string][][]netip.Addr{}, calls: map[string]int{}}
			if tt.answers != nil {
				var as []netip.Addr
				for _, a := range tt.answers {
					as = append(as, netip.MustParseAddr(a))
				}
				r.names["ipv4only.arpa"] = [][]netip.Addr{as}
			}
			cfg := Config{Resolver: r}
			for _, p := range tt.configured {
				cfg.NAT64Prefixes = append(cfg.NAT64Prefixes, netip.MustParsePrefix(p))
			}
			var buf bytes.Buffer
			WarnUnlistedNAT64(context.Background(), cfg, slog.New(slog.NewTextHandler(&buf, nil)))
			lines := strings.Split(strings.TrimSpace(buf.String()), "\n")
			if buf.Len() == 0 {
				lines = nil
			}
			if len(lines) != len(tt.want) {
				t.Fatalf("log %q, want a warning for each of %q", buf.String(), tt.want)
			}
			for i, want := range tt.want {
				if !strings.Contains(lines[i], "level=WARN") || !strings.Contains(lines[i], "prefix="+want) ||
					!strings.Contains(lines[i], "setting=egress.nat64_prefixes") {
					t.Errorf("line %q, want a warning naming %s and egress.nat64_prefixes", lines[i], want)
				}
			}
			if r.calls["ipv4only.arpa"] != 1 && tt.answers != nil {
				t.Errorf("ipv4only.arpa asked %d times", r.calls["ipv4only.arpa"])
			}
		})
	}
}

// TestIPv4CoveredIsWhatItsAddressesCarry checks ipv4Covered against the brute force: for a
// prefix under a NAT64 prefix of each RFC 6052 length, the IPv4 addresses its addresses carry
// (nat64Embedded), every value of the free bits where the address is put enumerated, are the
// IPv4 prefix ipv4Covered says, neither more (a wider denial) nor less (an address left open).
func TestIPv4CoveredIsWhatItsAddressesCarry(t *testing.T) {
	r := rand.New(rand.NewPCG(6052, 64))
	for range 20000 {
		bits := nat64Lengths[r.IntN(len(nat64Lengths))]
		var b [16]byte
		for i := range b {
			b[i] = byte(r.Uint32())
		}
		p := netip.PrefixFrom(netip.AddrFrom16(b), bits+r.IntN(129-bits)).Masked()
		var free []int // the bit positions of the embedded address p leaves free
		for pos, n := bits, 0; n < 32; pos++ {
			if pos >= 64 && pos < 72 {
				continue
			}
			if pos >= p.Bits() {
				free = append(free, pos)
			}
			n++
		}
		if len(free) > 12 {
			continue // too many to enumerate: a shorter prefix's are the same rule
		}
		carried := map[netip.Addr]bool{}
		for x := range 1 << len(free) {
			a := p.Addr().As16()
			for i := p.Bits(); i < 128; i++ { // the bits no address is put in: any value
				if r.IntN(2) == 1 {
					a[i/8] |= 1 << (7 - i%8)
				}
			}
			for i, pos := range free {
				a[pos/8] &^= 1 << (7 - pos%8)
				if x>>i&1 == 1 {
					a[pos/8] |= 1 << (7 - pos%8)
				}
			}
			carried[nat64Embedded(netip.AddrFrom16(a), bits)] = true
		}
		got, ok := ipv4Covered(p, bits)
		if !ok {
			if len(free) < 32 {
				t.Fatalf("ipv4Covered(%s, /%d) covers nothing, want the %d addresses it carries", p, bits, len(carried))
			}
			continue
		}
		if len(carried) != 1<<(32-got.Bits()) {
			t.Fatalf("ipv4Covered(%s, /%d) = %s, want the %d addresses it carries", p, bits, got, len(carried))
		}
		for a := range carried {
			if !got.Contains(a) {
				t.Fatalf("ipv4Covered(%s, /%d) = %s, not holding %s, which it carries", p, bits, got, a)
			}
		}
	}
}
