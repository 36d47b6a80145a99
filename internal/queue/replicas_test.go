package queue_test

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/url"
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
	// Route ports chosen by the kernel (:0) and released: a server of a JetStream cluster needs
	// configured routes before it starts, so each names the others' ports beforehand, and none
	// of them can take its own from the kernel with -1 (a port of another process may take one
	// in between, which would fail the test, not pass it).
	ports := make([]int, 3)
	for i := range ports {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		ports[i] = l.Addr().(*net.TCPAddr).Port
		l.Close()
	}
	var routes []*url.URL
	for _, p := range ports {
		routes = append(routes, &url.URL{Scheme: "nats", Host: fmt.Sprintf("127.0.0.1:%d", p)})
	}
	var servers []*server.Server
	for i, p := range ports {
		ns, err := server.NewServer(&server.Options{
			ServerName: fmt.Sprintf("n%d", i), Host: "127.0.0.1", Port: -1, JetStream: true, StoreDir: t.TempDir(),
			NoSigs: true, NoLog: true,
			Cluster: server.ClusterOpts{Name: "replicas", Host: "127.0.0.1", Port: p},
			Routes:  routes,
		})
		if err != nil {
			t.Fatal(err)
		}
		go ns.Start()
		t.Cleanup(func() { ns.Shutdown(); ns.WaitForShutdown() })
		servers = append(servers, ns)
	}
	for _, ns := range servers {
		if !ns.ReadyForConnections(30 * time.Second) {
			t.Fatal("server did not start")
		}
	}
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
