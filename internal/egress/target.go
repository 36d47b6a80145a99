package egress

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"strconv"
)

// verdict is a refusal: a reason and a short detail (never a secret).
type verdict struct {
	reason Reason
	detail string
}

func refuse(r Reason, detail string) *verdict { return &verdict{r, detail} }

// checkTarget decides a host and port: the worker's endpoints by name, the allowlist, then
// one resolution whose every address must pass the address table. It returns the address to
// dial: the one checked, never a name.
func (p *Proxy) checkTarget(ctx context.Context, h host, port int) (netip.AddrPort, *verdict) {
	explicit := p.policy.explicit(h, port)
	if r, d := p.filter.checkName(h, port, explicit); r != "" {
		return netip.AddrPort{}, refuse(r, d)
	}
	if !p.policy.allowed(h, port) {
		what := "no allow entry matches " + h.String() + ":" + strconv.Itoa(port)
		if h.isIP() {
			what = "an IP literal matches only an allow entry for that address"
		}
		return netip.AddrPort{}, refuse(ReasonNotAllowed, what)
	}
	addrs := []netip.Addr{h.addr}
	if !h.isIP() {
		rctx, cancel := context.WithTimeout(ctx, p.cfg.Limits.DialTimeout)
		defer cancel()
		var err error
		// Fully qualified: a relative name goes through the resolver's search list, and
		// "x.example.com" could come back as the address of "x.example.com.corp.internal".
		addrs, err = p.cfg.Resolver.LookupNetIP(rctx, "ip", h.name+".")
		if err != nil && ctx.Err() != nil {
			return netip.AddrPort{}, refuse(ReasonJobEnded, "the job ended before "+h.name+" resolved")
		}
		if err != nil || len(addrs) == 0 {
			return netip.AddrPort{}, refuse(ReasonResolve, fmt.Sprintf("%s did not resolve", h.name))
		}
	}
	// Every address must pass: a name that resolves to a public and a private address is a
	// rebinding attempt, whichever a client would pick.
	for _, a := range addrs {
		if r, d := p.filter.check(a, port, explicit, h.String()); r != "" {
			return netip.AddrPort{}, refuse(r, h.String()+" resolves to a denied address ("+d+")")
		}
	}
	if held := p.policy.heldBy(h); len(held) > 0 {
		p.held.note(h, addrs, held)
	}
	return netip.AddrPortFrom(addrs[0].Unmap().WithZone(""), uint16(port)), nil
}

// dial connects to a checked address. A dial that ctx's end cut short is no failure of the
// upstream: for the proxy's ctx, the job ended.
func (p *Proxy) dial(ctx context.Context, ap netip.AddrPort) (net.Conn, *verdict) {
	dctx, cancel := context.WithTimeout(ctx, p.cfg.Limits.DialTimeout)
	defer cancel()
	c, err := p.cfg.Dialer.DialContext(dctx, "tcp", ap.String())
	switch {
	case err == nil:
		return c, nil
	case ctx.Err() != nil:
		return nil, refuse(ReasonJobEnded, "the job ended before the upstream answered")
	default:
		return nil, refuse(ReasonDial, "upstream did not answer")
	}
}
