package egress

import (
	"context"
	"net/netip"
	"slices"
	"sync"
)

// A host a secret is bound to may keep what it was sent (a request log, a stored field) and
// hand it back under every name and address its server has, on every port: the proxy scrubs
// an answer of the values held by the host asked for (heldBy) and by every host a secret is
// bound to that has the address dialled, and terminates the TLS of a tunnel to such an
// address, with nothing swapped in, where it would have passed it through unread. Spliced to
// another name of api.example.com's server, to its address or to a port of it the secret is
// not bound on, the sandbox read a stored value in clear
// (TestStoredEchoIsScrubbedUnderEveryName).

// heldAddrs are the addresses the hosts secrets are bound to have had in this job, with the
// secrets each may hold: those the proxy resolved to decide a request, and, once, those of
// every exact name secrets are bound to (resolveHeld), so that an address is known as a bound
// host's before the job ever asks for that host. A name under a wildcard binding is known
// only once the job asks for it.
type heldAddrs struct {
	resolve  sync.Mutex // held through the one resolution of the bound names
	resolved bool
	mu       sync.Mutex
	by       map[netip.Addr][]*secret
	names    map[string]bool // names already resolved in this job
}

// note records that h, which may hold secrets, has addrs.
func (a *heldAddrs) note(h host, addrs []netip.Addr, secrets []*secret) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.by == nil {
		a.by, a.names = map[netip.Addr][]*secret{}, map[string]bool{}
	}
	if !h.isIP() {
		a.names[h.name] = true
	}
	for _, ad := range addrs {
		ad = ad.Unmap().WithZone("")
		for _, s := range secrets {
			if !slices.Contains(a.by[ad], s) {
				a.by[ad] = append(a.by[ad], s)
			}
		}
	}
}

// at returns the secrets the hosts at address ad may hold.
func (a *heldAddrs) at(ad netip.Addr) []*secret {
	a.mu.Lock()
	defer a.mu.Unlock()
	return slices.Clone(a.by[ad.Unmap().WithZone("")])
}

// known reports whether name's addresses were noted in this job.
func (a *heldAddrs) known(name string) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.names[name]
}

// heldFor returns the secrets an answer from h at ad is scrubbed of: those h is bound to on
// any port (heldBy), and those of every bound host at ad or at an IPv4 address ad carries
// (NAT64, 6to4...: addrFilter.embedded), which reaches the same server.
func (p *Proxy) heldFor(ctx context.Context, h host, ad netip.Addr) []*secret {
	p.resolveHeld(ctx)
	out := p.policy.heldBy(h)
	for _, a := range append([]netip.Addr{ad}, p.filter.embedded(ad.Unmap())...) {
		for _, s := range p.held.at(a) {
			if !slices.Contains(out, s) {
				out = append(out, s)
			}
		}
	}
	return out
}

// resolveHeld learns, once a job, the addresses of the exact names and addresses secrets are
// bound to that the job has not resolved yet. A name that does not resolve is left: the job
// cannot reach it by that name either, and if it resolves later, checkTarget notes it then.
func (p *Proxy) resolveHeld(ctx context.Context) {
	p.held.resolve.Lock()
	defer p.held.resolve.Unlock()
	if p.held.resolved {
		return
	}
	p.held.resolved = true
	tried := map[string]bool{}
	for _, s := range slices.Concat(p.policy.secrets, p.policy.scrubOnly) {
		for _, r := range s.heldAt() {
			switch {
			case r.addr.IsValid():
				p.held.note(host{addr: r.addr}, []netip.Addr{r.addr}, []*secret{s})
			case r.wildcard, tried[r.name], p.held.known(r.name):
			default:
				tried[r.name] = true
				rctx, cancel := context.WithTimeout(ctx, p.cfg.Limits.DialTimeout)
				addrs, err := p.cfg.Resolver.LookupNetIP(rctx, "ip", r.name+".")
				cancel()
				if err == nil {
					p.held.note(host{name: r.name}, addrs, p.policy.heldBy(host{name: r.name}))
				}
			}
		}
	}
}
