package submitcmd

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"

	"github.com/boxcar-run/boxcar/internal/config"
	"github.com/boxcar-run/boxcar/internal/job"
	"github.com/boxcar-run/boxcar/internal/queue"
	"github.com/boxcar-run/boxcar/test/harness"
)

// setUpCluster starts a three-node JetStream cluster and sets up the default tenant's queue on
// it with three replicas, so it outlives a node.
func setUpCluster(t *testing.T) ([]*server.Server, config.NATS) {
	t.Helper()
	servers := harness.StartCluster(t, 3)
	cfg := config.Config{}.WithDefaults().NATS
	cfg.Replicas = 3
	nc := connect(t, servers[0])
	admin, err := queue.NewAdmin(nc, cfg, nil, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	harness.Wait(t, "worker setup on the cluster", func() (bool, error) {
		err := admin.Declare(t.Context())
		return err == nil, err
	}, harness.Within(60*time.Second))
	return servers, cfg
}

func connect(t *testing.T, ns *server.Server) *nats.Conn {
	t.Helper()
	nc, err := queue.Connect(context.Background(), queue.ConnOptions{URL: ns.ClientURL(), Name: "test"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	return nc
}

// TestMissingQueueInAClusterIsSaidWithoutWaitingThePatience: in a JetStream cluster, submit
// waits out a stream NATS says is missing for missingWait at most, not for its whole patience:
// `submit run` for a tenant no worker set up waited its --timeout (30 minutes by default)
// before saying so. The patience here is an hour; the command must end on its own, saying the
// tenant is not served, long before the test's bound.
func TestMissingQueueInAClusterIsSaidWithoutWaitingThePatience(t *testing.T) {
	t.Parallel()
	servers, cfg := setUpCluster(t)
	nc := connect(t, servers[1])
	var stderr bytes.Buffer
	e := &env{getenv: func(string) string { return "" }, stderr: &stderr, tenantFlag: "team-x", patience: time.Hour}
	ctx, cancel := context.WithTimeout(context.Background(), harness.Timeout(90*time.Second))
	defer cancel()
	_, err := e.bind(ctx, nc, cfg)
	if ctx.Err() != nil || !errors.Is(err, queue.ErrNotServed) {
		t.Fatalf("bind for a tenant nobody set up, in a cluster: %v (test's bound passed: %v); want %v of its own, well within the hour's patience\n%s",
			err, ctx.Err() != nil, queue.ErrNotServed, stderr.String())
	}
}

// TestClusterElectionIsWaitedOut: the node leading the cluster's meta group goes away as
// submit looks the queue up; the lookups that get no answer meanwhile are waited out, and the
// queue, which is there, is found.
func TestClusterElectionIsWaitedOut(t *testing.T) {
	t.Parallel()
	servers, cfg := setUpCluster(t)
	var leader, survivor *server.Server
	harness.Wait(t, "a meta leader", func() (bool, error) {
		for _, ns := range servers {
			if ns.JetStreamIsLeader() {
				leader = ns
			}
		}
		return leader != nil, nil
	}, harness.Within(30*time.Second))
	for _, ns := range servers {
		if ns != leader {
			survivor = ns
		}
	}
	nc := connect(t, survivor)
	leader.Shutdown()
	var stderr bytes.Buffer
	e := &env{getenv: func(string) string { return "" }, stderr: &stderr, tenantFlag: job.DefaultTenant, patience: harness.Timeout(2 * time.Minute)}
	if _, err := e.bind(t.Context(), nc, cfg); err != nil {
		t.Fatalf("bind while the meta leader is gone: %v\n%s", err, stderr.String())
	}
}
