package workercmd

import (
	"fmt"
	"maps"
	"net"
	"slices"
	"strings"

	"github.com/boxcar-run/boxcar/internal/config"
)

// allowedEndpoints are check-config's warnings about network.allow entries that name one of the
// worker's own endpoints (NATS, store, model) by host and port: the egress proxy refuses an
// endpoint even when an entry names it exactly, so such an entry only looks like a grant, and
// the profile's jobs fail on it at run time. A warning, not a problem: the worker starts, and
// the rest of the profile's network works.
func allowedEndpoints(cfg config.Config, modelURL string) []string {
	eps := namedEndpoints(cfg, modelURL)
	var out []string
	for _, name := range slices.Sorted(maps.Keys(cfg.Profiles)) {
		n := cfg.Profiles[name].Network
		if n == nil {
			continue
		}
		for _, entry := range n.Allow {
			for _, e := range eps {
				if sameHostPort(entry, e.hostPort) {
					out = append(out, fmt.Sprintf("warning: profiles.%s.network.allow: %q is the worker's %s endpoint, which the egress proxy never lets a sandbox reach; remove the entry", name, entry, e.what))
					break
				}
			}
		}
	}
	return out
}

// sameHostPort reports whether an allow entry names exactly host:port ep, names compared as
// DNS does (in any case). Config validation allows only names in an entry, never an address, so
// an endpoint given by address is named by none. An entry without a port or with a wildcard
// names more than the endpoint, and the proxy lets the rest through.
func sameHostPort(entry, ep string) bool {
	h, p, err := net.SplitHostPort(strings.TrimSpace(entry))
	if err != nil || strings.HasPrefix(h, "*") {
		return false
	}
	eh, ep2, _ := net.SplitHostPort(ep)
	return p == ep2 && strings.EqualFold(h, strings.TrimSuffix(eh, "."))
}
