package egress

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"
)

// Proxy is one job's egress proxy. Make one per sandbox with New and serve it on a listener only
// that sandbox can reach.
type Proxy struct {
	cfg       Config
	policy    *compiledPolicy
	filter    *addrFilter
	ca        *authority
	roots     *x509.CertPool  // host roots plus Config.UpstreamCAPEM, for terminated upstreams
	transport *http.Transport // the upstream side of terminated tunnels (upstream.go)
	ledger    ledger
	held      heldAddrs    // the addresses of the hosts secrets are bound to (held.go)
	tunnels   atomic.Int64 // open CONNECT tunnels and forward connections
	reqs      atomic.Int64 // requests so far (Limits.MaxRequests)
	bytes     atomic.Int64 // bytes so far, both ways (Limits.MaxBytes)
	wg        sync.WaitGroup
}

// New checks cfg and policy (Check), generates the job's CA and one placeholder per secret.
// The error wraps ErrInvalidConfig or ErrInvalidPolicy (and ErrSecretValue for a value that
// cannot be used) and names the field at fault; it never contains a secret's value.
func New(cfg Config, policy Policy) (*Proxy, error) {
	cp, roots, err := check(cfg, policy)
	if err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	filter, err := newAddrFilter(cfg)
	if err != nil {
		return nil, err
	}
	names, addrs := caNames(cp)
	ca, err := newAuthority(cfg.CAValidity, names, addrs)
	if err != nil {
		return nil, err
	}
	p := &Proxy{cfg: cfg, policy: cp, filter: filter, ca: ca, roots: roots}
	p.held.servers = filter.servers
	p.cfg.Dialer = guardedDialer{cfg.Dialer, p}
	p.transport = p.newTransport()
	return p, nil
}

// Check reports what New would refuse in cfg and policy, without resolving or dialling
// anything: the worker calls it at start for each profile, so that settings every job of a
// profile would fail on stop the worker instead.
func Check(cfg Config, policy Policy) error {
	_, _, err := check(cfg, policy)
	return err
}

// check is New's checks: the config, the policy (compiled, placeholders made) and the upstream
// roots, which it returns with the compiled policy.
func check(cfg Config, policy Policy) (*compiledPolicy, *x509.CertPool, error) {
	if err := cfg.validate(); err != nil {
		return nil, nil, err
	}
	cp, err := compilePolicy(policy)
	if err != nil {
		return nil, nil, err
	}
	roots, err := x509.SystemCertPool()
	if err != nil {
		roots = x509.NewCertPool()
	}
	if len(cfg.UpstreamCAPEM) > 0 && !roots.AppendCertsFromPEM(cfg.UpstreamCAPEM) {
		return nil, nil, fmt.Errorf("%w: upstream CA: no PEM certificate found; give a PEM file", ErrInvalidConfig)
	}
	return cp, roots, nil
}

// caNames lists the names and addresses the job's CA may sign for: none when the job holds
// no secret; else every allowed one, since a tunnel to any allowed host is terminated when
// the host is at an address a secret-bound host has (held.go).
func caNames(cp *compiledPolicy) ([]string, []net.IP) {
	if len(cp.secrets)+len(cp.scrubOnly) == 0 {
		return nil, nil
	}
	var names []string
	var addrs []net.IP
	for _, r := range cp.allow {
		if r.addr.IsValid() {
			addrs = append(addrs, r.addr.AsSlice())
		} else {
			names = append(names, r.name)
		}
	}
	return names, addrs
}

// CACertPEM returns the job's CA certificate (PEM). The sandbox's clients must trust it, next to
// the usual roots, for the hosts secrets are bound to; its key never leaves the proxy.
func (p *Proxy) CACertPEM() []byte { return append([]byte(nil), p.ca.pem...) }

// Summary returns the egress so far: requests, denials, bytes, and per allowed host.
func (p *Proxy) Summary() Summary { return p.ledger.summary() }

// Serve accepts connections on ln until ctx ends or ln fails, then closes ln and every open
// connection, waits for their goroutines and returns nil (ctx ended) or the accept error.
func (p *Proxy) Serve(ctx context.Context, ln net.Listener) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var conns sync.Map
	stop := p.afterFunc(ctx, "listener's close", func() {
		ln.Close()
		conns.Range(func(k, _ any) bool { k.(net.Conn).Close(); return true })
	})
	defer stop()
	var err error
	for {
		c, aerr := ln.Accept()
		if aerr != nil {
			if ctx.Err() == nil {
				err = fmt.Errorf("egress: accept: %w", aerr)
			}
			break
		}
		conns.Store(c, nil)
		p.wg.Add(1)
		p.cfg.Go(func() {
			defer p.wg.Done()
			defer conns.Delete(c)
			defer c.Close()
			p.serveConn(ctx, c)
		})
	}
	cancel()
	p.wg.Wait()
	p.transport.CloseIdleConnections()
	if errors.Is(err, net.ErrClosed) {
		return nil
	}
	return err
}

// decide settles a decision: ledger, metrics, log line and callback.
func (p *Proxy) decide(d Decision) {
	if d.Time.IsZero() {
		d.Time = time.Now()
	}
	p.ledger.add(d)
	p.cfg.Metrics.record(d)
	p.cfg.Logger.Debug("egress", "allowed", d.Allowed, "reason", d.Reason, "method", d.Method,
		"host", d.Host, "port", d.Port, "addr", d.Addr, "bytes_out", d.BytesOut, "bytes_in", d.BytesIn,
		"duration_ms", d.Duration.Milliseconds())
	if p.cfg.OnDecision != nil {
		p.cfg.OnDecision(d)
	}
}

// upstreamTLS is the client config for a terminated upstream named serverName.
func (p *Proxy) upstreamTLS(serverName string) *tls.Config {
	return &tls.Config{ServerName: serverName, RootCAs: p.roots, MinVersion: tls.VersionTLS12, NextProtos: []string{"http/1.1"}}
}
