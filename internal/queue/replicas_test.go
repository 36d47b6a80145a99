package queue_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/url"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"

	"github.com/boxcar-run/boxcar/internal/config"
	"github.com/boxcar-run/boxcar/internal/job"
	"github.com/boxcar-run/boxcar/internal/queue"
	"github.com/boxcar-run/boxcar/test/harness"
)

// cluster3 starts three nats-servers in-process on loopback, routed into one JetStream
// cluster, and returns a connection to the first once the cluster has a meta leader.
func cluster3(t *testing.T) *nats.Conn {
	t.Helper()
	servers := startCluster(t, 3, freePorts)
	first := servers[0]
	nc, err := queue.Connect(context.Background(), queue.ConnOptions{URL: first.ClientURL(), Name: "test"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js := jetStream(t, nc)
	harness.Wait(t, "the JetStream cluster to form", func() (bool, error) {
		_, err := js.AccountInfo(context.Background())
		return err == nil, err
	}, harness.Within(30*time.Second))
	return nc
}

// clusterTries is how many sets of route ports startCluster takes before it gives up.
const clusterTries = 5

// startCluster starts n routed nats-servers with JetStream and returns them once each accepts
// connections. A server of a JetStream cluster needs its routes configured before it starts, so
// each names the others' route ports beforehand, and none of them can take its own from the
// kernel with -1: ports gives n ports the kernel chose and released. Another process may take
// one in between; then a server cannot listen on it, and the whole cluster starts again on
// fresh ports, up to clusterTries times.
func startCluster(t *testing.T, n int, ports func(*testing.T, int) []int) []*server.Server {
	t.Helper()
	for try := 1; ; try++ {
		servers, err := tryCluster(t, ports(t, n))
		if err == nil {
			return servers
		}
		if !errors.Is(err, errRoutePortTaken) || try == clusterTries {
			t.Fatalf("start a cluster of %d nats-servers (try %d of %d): %v", n, try, clusterTries, err)
		}
		t.Logf("try %d: %v; again on fresh ports", try, err)
	}
}

// clusters counts the clusters started in this process, for their names.
var clusters atomic.Int64

var errRoutePortTaken = errors.New("a route port was taken before its server listened on it")

// tryCluster starts a server on each route port, routed to all of them; on an error it shuts
// down what it started.
func tryCluster(t *testing.T, ports []int) (servers []*server.Server, err error) {
	var routes []*url.URL
	for _, p := range ports {
		routes = append(routes, &url.URL{Scheme: "nats", Host: fmt.Sprintf("127.0.0.1:%d", p)})
	}
	var started []chan struct{}
	stop := func() { // last started, first stopped, as the tests' cleanups did
		for i := len(servers) - 1; i >= 0; i-- {
			<-started[i] // a server shut down while it starts may go on starting (a store, a timer)
			servers[i].Shutdown()
			servers[i].WaitForShutdown()
		}
	}
	defer func() {
		if err != nil {
			// Shut down once the servers that could listen are up: one shut down while its
			// JetStream starts may leave a store of it running.
			for _, ns := range servers {
				ns.ReadyForConnections(harness.Timeout(5 * time.Second))
			}
			stop()
		}
	}()
	// A name of its own: a route port another test's cluster was given too (released ports
	// are handed out again) joins no server of that cluster.
	name := fmt.Sprintf("replicas-%d", clusters.Add(1))
	var failed []*listenWatch
	for i, p := range ports {
		ns, err := server.NewServer(&server.Options{
			ServerName: fmt.Sprintf("n%d", i), Host: "127.0.0.1", Port: -1, JetStream: true, StoreDir: t.TempDir(),
			NoSigs: true, NoLog: true,
			Cluster: server.ClusterOpts{Name: name, Host: "127.0.0.1", Port: p},
			Routes:  routes,
		})
		if err != nil {
			return servers, err
		}
		lw := &listenWatch{failed: make(chan string, 1)}
		ns.SetLogger(lw, false, false)
		done := make(chan struct{})
		go func() { defer close(done); ns.Start() }()
		servers, failed, started = append(servers, ns), append(failed, lw), append(started, done)
	}
	for i, ns := range servers {
		if err := awaitListening(ns, failed[i]); err != nil {
			return servers, err
		}
	}
	t.Cleanup(stop)
	return servers, nil
}

// awaitListening waits for ns to accept connections, or to say it cannot listen on a port.
func awaitListening(ns *server.Server, lw *listenWatch) error {
	deadline := time.Now().Add(harness.Timeout(30 * time.Second))
	for !ns.ReadyForConnections(100 * time.Millisecond) {
		select {
		case msg := <-lw.failed:
			return fmt.Errorf("%w: %s", errRoutePortTaken, msg)
		default:
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("nats-server %s did not start", ns.Name())
		}
	}
	return nil
}

// listenWatch is a nats-server's logger that reports its fatal errors, as a server that
// cannot listen on its route port logs one (and carries on without routes), and drops the
// rest.
type listenWatch struct{ failed chan string }

func (l *listenWatch) Fatalf(format string, v ...any) {
	select {
	case l.failed <- fmt.Sprintf(format, v...):
	default:
	}
}
func (*listenWatch) Noticef(string, ...any) {}
func (*listenWatch) Warnf(string, ...any)   {}
func (*listenWatch) Errorf(string, ...any)  {}
func (*listenWatch) Debugf(string, ...any)  {}
func (*listenWatch) Tracef(string, ...any)  {}

// freePorts are n loopback ports the kernel chose (:0), released for a server to take.
func freePorts(t *testing.T, n int) []int {
	t.Helper()
	ports := make([]int, n)
	for i := range ports {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		ports[i] = l.Addr().(*net.TCPAddr).Port
		l.Close()
	}
	return ports
}

// TestStartClusterTakesFreshPortsWhenOneIsTaken: a route port taken by another process between
// its reservation and its server's start (here held by the test) fails that start, and the
// cluster starts on fresh ports; before, the test that needed the cluster failed.
func TestStartClusterTakesFreshPortsWhenOneIsTaken(t *testing.T) {
	t.Parallel()
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	var calls int
	ports := func(t *testing.T, n int) []int {
		calls++
		p := freePorts(t, n)
		if calls == 1 {
			p[1] = taken.Addr().(*net.TCPAddr).Port
		}
		return p
	}
	servers := startCluster(t, 3, ports)
	if calls != 2 || len(servers) != 3 {
		t.Errorf("started %d servers after %d sets of ports; want 3 after 2, the first with a port taken", len(servers), calls)
	}
}

// TestSetupAppliesReplicasToEveryStreamAndBucket: nats.replicas is "Replicas of the stream and
// bucket in a cluster". An operator who moves a fleet set up with replicas 1 to a three-node
// cluster's replicas 3 runs `worker setup` again: every stream, consumer and bucket is raised to
// 3. Before, the status bucket, which holds each job's state, its spent budget and its cancel,
// stayed on one node, silently: setup only set the expiry of a status bucket that existed.
func TestSetupAppliesReplicasToEveryStreamAndBucket(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	nc := cluster3(t)
	js := jetStream(t, nc)
	cfg := config.Config{}.WithDefaults().NATS
	declare := func(replicas int) {
		t.Helper()
		c := cfg
		c.Replicas = replicas
		admin, err := queue.NewAdmin(nc, c, nil, slog.New(slog.DiscardHandler))
		if err != nil {
			t.Fatal(err)
		}
		harness.Wait(t, fmt.Sprintf("worker setup with replicas %d", replicas), func() (bool, error) {
			err := admin.Declare(ctx)
			return err == nil, err
		}, harness.Within(60*time.Second))
	}
	declare(1) // the older setup
	declare(3) // `worker setup` after the move to three replicas
	for _, name := range []string{cfg.Stream, cfg.DeadLetterStream, "KV_" + queue.CancelBucket, "KV_" + cfg.ApprovalsBucket, "KV_" + queue.UsageBucket,
		"KV_" + queue.ProfilesBucket, "KV_" + cfg.StatusBucket} {
		s, err := js.Stream(ctx, name)
		if err != nil {
			t.Fatal(err)
		}
		if got := s.CachedInfo().Config.Replicas; got != 3 {
			t.Errorf("after worker setup with replicas 3, stream %s has %d replica(s), want 3", name, got)
		}
	}
	c, err := js.Consumer(ctx, cfg.Stream, cfg.Consumer+"-"+job.DefaultTenant)
	if err != nil {
		t.Fatal(err)
	}
	if got := c.CachedInfo().Config.Replicas; got != 3 {
		t.Errorf("after worker setup with replicas 3, consumer %s has %d replica(s), want 3", c.CachedInfo().Name, got)
	}
}
