package egress

import (
	"context"
	"errors"
	"net"
	"net/netip"
	"runtime/debug"
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
	servers func(netip.Addr) []netip.Addr // the keys of the servers an address reaches
	mu      sync.Mutex
	by      map[netip.Addr][]*secret // by server key (addrFilter.servers)
	names   map[string]bool          // names already resolved in this job
	lookups map[string]*heldLookup   // the look-ups of bound names, one a name
}

// heldLookup is one look-up of a bound name, waited for by every request that needs it.
// Each name has its own: under one lock for all, one slow answer held every other name's
// look-up, and every request of the job, behind it (TestHeldLookUpsWaitForNoOtherName).
type heldLookup struct {
	done  chan struct{} // closed when the fields below are set
	ok    bool          // answered, or the name does not exist
	retry time.Time     // not ok: when to look the name up again, at the soonest
	pp    *proxyPanic   // the Resolver panicked: each request that waited fails with it
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
// that the job has not resolved yet, and waits for them: at the job's first request, and
// again, a dial_timeout after the last try at the soonest, while a look-up failed but for the
// name not existing. Each name is looked up on its own goroutine (heldLookup), all at once,
// and a request waits for every look-up in flight, whoever started it. A name that does not
// exist is left: if it comes to resolve later, checkTarget notes it when the job asks for it.
// A look-up that timed out, taken for one, left the bound host's server open under every
// other name for the rest of the job (TestHeldLookUpIsTriedAgain).
func (p *Proxy) resolveHeld(ctx context.Context) {
	var wait []*heldLookup
	for _, s := range slices.Concat(p.policy.secrets, p.policy.scrubOnly) {
		for _, r := range s.heldAt() {
			switch {
			case r.addr.IsValid():
				p.held.note(host{addr: r.addr}, []netip.Addr{r.addr}, []*secret{s})
			case r.wildcard:
			default:
				if l := p.heldLookup(ctx, r.name); l != nil && !slices.Contains(wait, l) {
					wait = append(wait, l)
				}
			}
		}
	}
	for _, l := range wait {
		select {
		case <-l.done:
			if l.pp != nil {
				panic(l.pp)
			}
		case <-ctx.Done():
			return
		}
	}
}

// heldLookup returns name's look-up to wait for, starting one when the name was never looked
// up or its last look-up failed a dial_timeout ago; nil when there is none to wait for (the
// name is known, or does not exist, or failed too recently to try again).
func (p *Proxy) heldLookup(ctx context.Context, name string) *heldLookup {
	a := &p.held
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.names[name] {
		return nil
	}
	if l := a.lookups[name]; l != nil {
		select {
		case <-l.done:
			if l.ok || time.Now().Before(l.retry) {
				return nil
			}
		default:
			return l
		}
	}
	if a.lookups == nil {
		a.lookups = map[string]*heldLookup{}
	}
	l := &heldLookup{done: make(chan struct{})}
	a.lookups[name] = l
	p.wg.Add(1) // Serve waits for it; the caller's connection holds the count above 0
	p.cfg.Go(func() {
		defer p.wg.Done()
		defer close(l.done)
		defer func() {
			if r := recover(); r != nil {
				l.pp = &proxyPanic{what: "resolver's look-up of a bound name", value: r, stack: debug.Stack()}
				l.retry = time.Now().Add(p.cfg.Limits.DialTimeout)
			}
		}()
		if l.ok = p.noteHeld(ctx, name); !l.ok {
			l.retry = time.Now().Add(p.cfg.Limits.DialTimeout)
		}
	})
	return l
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
