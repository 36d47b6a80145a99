// Command coredns is CoreDNS with only the plugins the test cluster's Corefile uses: cluster
// names from the kubernetes plugin, and no forward plugin, so no query ever leaves the
// machine. Its own module keeps CoreDNS's dependencies out of test/cluster's go.mod; build.sh
// builds it once into the cache.
package main

import (
	"slices"

	"github.com/coredns/coredns/core/dnsserver"
	"github.com/coredns/coredns/coremain"

	_ "github.com/coredns/coredns/plugin/bind"
	_ "github.com/coredns/coredns/plugin/cache"
	_ "github.com/coredns/coredns/plugin/errors"
	_ "github.com/coredns/coredns/plugin/health"
	_ "github.com/coredns/coredns/plugin/kubernetes"
	_ "github.com/coredns/coredns/plugin/log"
	_ "github.com/coredns/coredns/plugin/ready"
)

// plugins is what this build registers; Directives keeps CoreDNS's own order among them.
var plugins = []string{"bind", "cache", "errors", "health", "kubernetes", "log", "ready"}

func init() {
	dnsserver.Directives = slices.DeleteFunc(dnsserver.Directives, func(d string) bool {
		return !slices.Contains(plugins, d)
	})
}

func main() { coremain.Run() }
