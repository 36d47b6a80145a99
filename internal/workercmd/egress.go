package workercmd

import (
	"fmt"
	"net"
	"net/netip"
	"net/url"
	"os"
	"strings"
	"time"

	"github.com/boxcar-run/boxcar/internal/config"
	"github.com/boxcar-run/boxcar/internal/egress"
)

// egressConfig is the worker-level setting of every networked job's proxy: the config's egress
// section (proxyConfig), the worker's own endpoints (never reachable through a proxy) and the
// metrics. Each networked profile was checked with it at start (checkProfileEgress).
func egressConfig(cfg config.Config, modelURL string, m *egress.Metrics) (egress.Config, error) {
	ec, err := proxyConfig(cfg)
	if err != nil {
		return egress.Config{}, err
	}
	ec.WorkerEndpoints = workerEndpoints(cfg, modelURL)
	ec.Metrics = m
	return ec, nil
}

// networked reports whether a profile has a network: only then does a job get a proxy.
func networked(cfg config.Config) bool {
	for _, p := range cfg.Profiles {
		if p.Network != nil {
			return true
		}
	}
	return false
}

// proxyConfig is what the config's egress section says of every proxy.
func proxyConfig(cfg config.Config) (egress.Config, error) {
	e := cfg.Egress
	ec := egress.Config{
		ResolverAddr: e.Resolver,
		Limits: egress.Limits{
			MaxRequests: e.Limits.MaxRequests, MaxBytes: e.Limits.MaxBytes, MaxTunnels: e.Limits.MaxTunnels,
			MaxHeaderBytes: e.Limits.MaxHeaderBytes, HeaderTimeout: time.Duration(e.Limits.HeaderTimeout),
			DialTimeout: time.Duration(e.Limits.DialTimeout), IdleTimeout: time.Duration(e.Limits.IdleTimeout),
		},
	}
	if e.UpstreamCA != "" {
		pem, err := os.ReadFile(e.UpstreamCA)
		if err != nil {
			return egress.Config{}, fmt.Errorf("egress.upstream_ca: %w", err)
		}
		ec.UpstreamCAPEM = pem
	}
	for _, c := range e.DeniedCIDRs {
		ec.DeniedCIDRs = append(ec.DeniedCIDRs, netip.MustParsePrefix(c)) // config.Validate checked them
	}
	for _, c := range e.AllowedCIDRs {
		ec.AllowedCIDRs = append(ec.AllowedCIDRs, netip.MustParsePrefix(c))
	}
	for _, c := range e.NAT64Prefixes {
		ec.NAT64Prefixes = append(ec.NAT64Prefixes, netip.MustParsePrefix(c))
	}
	return ec, nil
}

// workerEndpoints are the host:port of NATS, the store and the model, as the worker reaches them.
func workerEndpoints(cfg config.Config, modelURL string) []string {
	var out []string
	for _, e := range namedEndpoints(cfg, modelURL) {
		out = append(out, e.hostPort)
	}
	return out
}

// endpoint is one of the worker's own endpoints: what it is ("NATS", "store", "model") and
// its host:port.
type endpoint struct{ what, hostPort string }

// namedEndpoints are workerEndpoints, each with what it is.
func namedEndpoints(cfg config.Config, modelURL string) []endpoint {
	var out []endpoint
	add := func(what, raw string, httpURL bool) {
		u, err := url.Parse(strings.TrimSpace(raw))
		if err != nil || u.Hostname() == "" {
			return
		}
		port := u.Port()
		if port == "" {
			port = defaultPort(u.Scheme, httpURL)
		}
		out = append(out, endpoint{what, net.JoinHostPort(u.Hostname(), port)})
	}
	for _, n := range strings.Split(cfg.NATS.URL, ",") {
		add("NATS", n, false)
	}
	add("store", cfg.Store.Endpoint, true)
	add("model", modelURL, true)
	return out
}

// defaultPort is the port a URL without one is reached on: the proxy denies an endpoint on
// that port only, so an http:// store or model denied on 443 stayed reachable on 80.
func defaultPort(scheme string, httpURL bool) string {
	switch {
	case !httpURL:
		return "4222" // nats:// and tls://: the NATS client's default
	case scheme == "http":
		return "80"
	}
	return "443"
}
