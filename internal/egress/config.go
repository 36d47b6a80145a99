package egress

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"time"
)

// Resolver resolves a name to addresses. *net.Resolver satisfies it; tests pass a stub. The
// proxy asks for a request's host fully qualified ("api.example.com.", so that no search
// domain is tried); a worker endpoint's name as configured.
type Resolver interface {
	LookupNetIP(ctx context.Context, network, host string) ([]netip.Addr, error)
}

// Dialer opens the upstream connection to an address the proxy has already checked
// ("ip:port", never a name). *net.Dialer satisfies it; tests pass a stub.
type Dialer interface {
	DialContext(ctx context.Context, network, address string) (net.Conn, error)
}

// Config is the worker-level part of the proxy's settings: the same for every job.
type Config struct {
	// ResolverAddr is the "host:port" of the DNS server the proxy asks (over UDP, then TCP).
	// Default: the host's resolver. Ignored when Resolver is set.
	ResolverAddr string
	// Resolver overrides ResolverAddr (tests, or a caller's own cache).
	Resolver Resolver
	// Dialer opens upstream connections. Default: a net.Dialer with Limits.DialTimeout.
	Dialer Dialer
	// UpstreamCAPEM holds extra PEM certificates trusted, besides the host's roots, when the
	// proxy verifies an upstream it terminates TLS for. Default: none.
	UpstreamCAPEM []byte
	// DeniedCIDRs are denied on top of the built-in ranges; they win over AllowedCIDRs.
	DeniedCIDRs []netip.Prefix
	// AllowedCIDRs lift the built-in denial of private, shared (CGNAT), documentation,
	// benchmarking and other special-purpose ranges for the addresses they cover (an internal
	// package mirror, the tests' 198.18.0.0/15). They never lift loopback, link-local,
	// unspecified, multicast, broadcast, cloud metadata, the host's own addresses or
	// WorkerEndpoints.
	AllowedCIDRs []netip.Prefix
	// NAT64Prefixes are the network's own NAT64 prefixes (RFC 6052: /32, /40, /48, /56, /64 or
	// /96; a DNS64 that answers with a global prefix, or a local one in 64:ff9b:1::/48): an
	// address in one reaches the IPv4 address it carries, which is checked as well. The
	// well-known 64:ff9b::/96 is always one.
	NAT64Prefixes []netip.Prefix
	// WorkerEndpoints are the worker's own "host:port" endpoints (NATS, store, model): never
	// reachable through the proxy, by name or by any address the name resolves to at New. Their
	// hosts, by name and those addresses, are refused on every other port too, unless the
	// policy's allow list names exactly that host and port (and, narrowed, its profile's does).
	WorkerEndpoints []string
	// HostAddrs are addresses of this host denied on top of those of its interfaces, which New
	// reads itself (a NAT or load-balancer address the host answers on).
	HostAddrs []netip.Addr
	// Limits are the per-job caps.
	Limits Limits
	// CAValidity is how long the per-job CA and its leaves are valid. Default: 24h.
	CAValidity time.Duration
	// Metrics records boxcar_egress_*; nil records nothing. Make it once per worker.
	Metrics *Metrics
	// Logger gets one debug line per decision (never a secret's value). Default: discard.
	Logger *slog.Logger
	// OnDecision, if set, is called with every decision, synchronously, from the connection's
	// goroutine: keep it short (append to the transcript).
	OnDecision func(Decision)
	// Go starts each goroutine the proxy runs for the job (a connection's, a spliced tunnel's
	// copy) and returns; a panic the proxy recovered on a goroutine of net/http's is raised
	// again on one it starts (guard.go). The worker's ends the job's attempt on a panic in one
	// (the runner's goGuarded). Default: a go statement that logs a panic to Logger and ends
	// nothing else.
	Go func(f func())
}

// Limits are the per-job caps; zero fields take the defaults.
type Limits struct {
	// MaxRequests caps the requests a job makes (each forwarded request, each CONNECT and each
	// request inside a terminated tunnel), refused or not; past it the proxy reads no request.
	// Default: 10,000.
	MaxRequests int64
	// MaxBytes caps the bytes a job moves through the proxy, both directions, the proxy's own
	// answers included (refusals, 100 Continue, a CONNECT's 200) and a refused body read and
	// dropped before its connection is closed (lingerClose): a transfer is cut at the cap,
	// and once the job is at it every new request and tunnel is refused before it is dialled,
	// the first in room kept back for that refusal, the rest with no answer. Default: 1 GiB.
	MaxBytes int64
	// MaxTunnels caps concurrent CONNECT tunnels and forward connections. Default: 64.
	MaxTunnels int
	// MaxHeaderBytes caps a request's line and header fields. Default: 32 KiB.
	MaxHeaderBytes int
	// HeaderTimeout is how long a client has to send a request's header, or a ClientHello
	// after CONNECT: from the connection's start for its first request, from the first byte
	// for a next one (a kept-alive connection may be idle for IdleTimeout between requests,
	// and is then closed with no decision). Default: 10 s.
	HeaderTimeout time.Duration
	// DialTimeout bounds each step of reaching an upstream: name resolution, the dial, and the
	// TLS handshake when the proxy terminates TLS (so up to three times it in all). Default: 10 s.
	DialTimeout time.Duration
	// IdleTimeout closes a tunnel or connection with no traffic either way: bytes flowing one
	// way keep it open, however long the other side is silent. Default: 5 min.
	IdleTimeout time.Duration
}

// withDefaults returns the config with zero fields set to their defaults.
func (c Config) withDefaults() Config {
	l := &c.Limits
	setDefault(&l.MaxRequests, 10_000)
	setDefault(&l.MaxBytes, 1<<30)
	setDefault(&l.MaxTunnels, 64)
	setDefault(&l.MaxHeaderBytes, 32<<10)
	setDefault(&l.HeaderTimeout, 10*time.Second)
	setDefault(&l.DialTimeout, 10*time.Second)
	setDefault(&l.IdleTimeout, 5*time.Minute)
	setDefault(&c.CAValidity, 24*time.Hour)
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	if c.Go == nil {
		c.Go = guardedGo(c.Logger)
	}
	if c.Resolver == nil {
		c.Resolver = newResolver(c.ResolverAddr)
	}
	if c.Dialer == nil {
		c.Dialer = &net.Dialer{Timeout: l.DialTimeout}
	}
	return c
}

func setDefault[T int | int64 | time.Duration](v *T, d T) {
	if *v == 0 {
		*v = d
	}
}

// validate names the field at fault and the fix.
func (c Config) validate() error {
	l := c.Limits
	switch {
	case l.MaxRequests < 0, l.MaxBytes < 0, l.MaxTunnels < 0, l.MaxHeaderBytes < 0:
		return fmt.Errorf("%w: limits must not be negative (0 takes the default)", ErrInvalidConfig)
	case l.HeaderTimeout < 0, l.DialTimeout < 0, l.IdleTimeout < 0, c.CAValidity < 0:
		return fmt.Errorf("%w: timeouts must not be negative (0 takes the default)", ErrInvalidConfig)
	case l.MaxHeaderBytes != 0 && l.MaxHeaderBytes < 1024:
		return fmt.Errorf("%w: limits.max_header_bytes %d is below 1024; real clients send more", ErrInvalidConfig, l.MaxHeaderBytes)
	}
	for _, p := range c.NAT64Prefixes {
		if err := checkNAT64Prefix(p); err != nil {
			return fmt.Errorf("%w: %w", ErrInvalidConfig, err)
		}
	}
	for _, ep := range c.WorkerEndpoints {
		if _, _, err := net.SplitHostPort(ep); err != nil {
			return fmt.Errorf("%w: worker endpoint %q: want host:port: %w", ErrInvalidConfig, ep, err)
		}
	}
	return nil
}

// newResolver asks addr ("host:port") when set, the host's resolver otherwise.
func newResolver(addr string) Resolver {
	if addr == "" {
		return net.DefaultResolver
	}
	return &net.Resolver{PreferGo: true, Dial: func(ctx context.Context, network, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, network, addr)
	}}
}
