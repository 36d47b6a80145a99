package egress

import (
	"context"
	"errors"
	"net"
	"net/netip"
	"slices"
	"sync"
	"time"
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
// secrets each may hold: those the proxy resolved to decide a request, and those of every
// exact name secrets are bound to (resolveHeld), so that an address is known as a bound
// host's before the job ever asks for that host. A name under a wildcard binding is known
// only once the job asks for it.
type heldAddrs struct {
	resolve  sync.Mutex                    // held through a resolution of the bound names
	resolved bool                          // every bound name resolved, or does not exist
	retry    time.Time                     // not resolved: when to try the names that failed again
	servers  func(netip.Addr) []netip.Addr // the keys of the servers an address reaches
	mu       sync.Mutex
	by       map[netip.Addr][]*secret // by server key (addrFilter.servers)
	names    map[string]bool          // names already resolved in this job
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
		for _, k := range a.servers(ad) {
			for _, s := range secrets {
				if !slices.Contains(a.by[k], s) {
					a.by[k] = append(a.by[k], s)
				}
			}
		}
	}
}

// at returns the secrets the hosts at a server ad reaches may hold, whatever form of its
// address they were found at.
func (a *heldAddrs) at(ad netip.Addr) []*secret {
	a.mu.Lock()
	defer a.mu.Unlock()
	var out []*secret
	for _, k := range a.servers(ad) {
		for _, s := range a.by[k] {
			if !slices.Contains(out, s) {
				out = append(out, s)
			}
		}
	}
	return out
}

// known reports whether name's addresses were noted in this job.
func (a *heldAddrs) known(name string) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.names[name]
}

// heldFor returns the secrets an answer from h at ad is scrubbed of: those h is bound to on
// any port (heldBy), and those of every bound host at an address of the server ad reaches
// (addrFilter.servers: an IPv4 address and its NAT64, 6to4... forms, either way round).
func (p *Proxy) heldFor(ctx context.Context, h host, ad netip.Addr) []*secret {
	p.resolveHeld(ctx)
	out := p.policy.heldBy(h)
	for _, s := range p.held.at(ad) {
		if !slices.Contains(out, s) {
			out = append(out, s)
		}
	}
	return out
}

// resolveHeld learns the addresses of the exact names and addresses secrets are bound to
// that the job has not resolved yet: at the job's first request, and again, a dial_timeout
// after the last try at the soonest, while a look-up failed but for the name not existing. A
// name that does not exist is left: if it comes to resolve later, checkTarget notes it when
// the job asks for it. A look-up that timed out, taken for one, left the bound host's server
// open under every other name for the rest of the job (TestHeldLookUpIsTriedAgain).
func (p *Proxy) resolveHeld(ctx context.Context) {
	p.held.resolve.Lock()
	defer p.held.resolve.Unlock()
	if p.held.resolved || time.Now().Before(p.held.retry) {
		return
	}
	failed := false
	tried := map[string]bool{}
	for _, s := range slices.Concat(p.policy.secrets, p.policy.scrubOnly) {
		for _, r := range s.heldAt() {
			switch {
			case r.addr.IsValid():
				p.held.note(host{addr: r.addr}, []netip.Addr{r.addr}, []*secret{s})
			case r.wildcard, tried[r.name], p.held.known(r.name):
			default:
				tried[r.name] = true
				if !p.noteHeld(ctx, r.name) {
					failed = true
				}
			}
		}
	}
	p.held.resolved, p.held.retry = !failed, time.Now().Add(p.cfg.Limits.DialTimeout)
}

// noteHeld looks a bound name up and notes its addresses. It reports false when the look-up
// failed but for the name not existing.
func (p *Proxy) noteHeld(ctx context.Context, name string) bool {
	rctx, cancel := context.WithTimeout(ctx, p.cfg.Limits.DialTimeout)
	defer cancel()
	addrs, err := p.cfg.Resolver.LookupNetIP(rctx, "ip", name+".")
	var dnsErr *net.DNSError
	switch {
	case err == nil:
		p.held.note(host{name: name}, addrs, p.policy.heldBy(host{name: name}))
	case errors.As(err, &dnsErr) && dnsErr.IsNotFound:
	default:
		return false
	}
	return true
}
