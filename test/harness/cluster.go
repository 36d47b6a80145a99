package harness

import (
	"fmt"
	"net/url"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"

	"github.com/boxcar-run/boxcar/internal/testnet"
)

// clusters counts the clusters started in this process, for their names.
var clusters atomic.Int64

// StartCluster starts n routed nats-servers with JetStream, each on route and client ports the
// kernel chose (-1), and returns them once each accepts connections and has a route to every
// other. No port is reserved and released for a server to take later: the first server is the
// seed, and the others route to the route port it bound, read back once it listens; routes
// are gossiped, so they all meet.
//
// The number of a server's configured routes is how many peers its JetStream meta group
// expects at bootstrap (nats-server's bootstrapRaftNode), and clustered JetStream does not
// start without one, so each server is given n: the seed's route where it is known, and
// loopback addresses that refuse connections for the whole test for the rest (nats-server's
// own tests use 127.0.0.1:1 for that): they count, and nothing answers on them.
func StartCluster(t *testing.T, n int) []*server.Server {
	t.Helper()
	name := fmt.Sprintf("replicas-%d", clusters.Add(1)) // a name of its own, as a test's cluster
	var seed *url.URL
	var servers []*server.Server
	for i := range n {
		var routes []*url.URL
		if seed != nil {
			routes = append(routes, seed)
		}
		for len(routes) < n {
			routes = append(routes, &url.URL{Scheme: "nats", Host: testnet.ClosedAddr(t)})
		}
		ns, err := server.NewServer(&server.Options{
			ServerName: fmt.Sprintf("n%d", i), Host: "127.0.0.1", Port: -1, JetStream: true, StoreDir: t.TempDir(),
			NoSigs: true, NoLog: true,
			Cluster: server.ClusterOpts{Name: name, Host: "127.0.0.1", Port: -1},
			Routes:  routes,
		})
		if err != nil {
			t.Fatalf("nats-server %d of %d: %v", i+1, n, err)
		}
		// After its store's TempDir, so it runs before the directory is removed; the last
		// started is the first stopped.
		t.Cleanup(func() {
			ns.Shutdown()
			ns.WaitForShutdown()
		})
		ns.Start()
		servers = append(servers, ns)
		if !ns.ReadyForConnections(Timeout(30 * time.Second)) {
			t.Fatalf("nats-server %d of %d did not start", i+1, n)
		}
		if seed == nil {
			seed = &url.URL{Scheme: "nats", Host: ns.ClusterAddr().String()}
		}
	}
	Wait(t, fmt.Sprintf("%d nats-servers to route to each other", n), func() (bool, error) {
		for _, ns := range servers {
			if ns.NumRoutes() < n-1 {
				return false, nil
			}
		}
		return true, nil
	}, Within(30*time.Second))
	return servers
}
