package queue_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/boxcar-run/boxcar/internal/config"
	"github.com/boxcar-run/boxcar/internal/job"
	"github.com/boxcar-run/boxcar/internal/queue"
	"github.com/boxcar-run/boxcar/test/harness"
)

// cluster3 starts three nats-servers in-process on loopback, routed into one JetStream
// cluster, and returns a connection to the first once the cluster's meta group has all three.
func cluster3(t *testing.T) *nats.Conn {
	t.Helper()
	servers := harness.StartCluster(t, 3)
	first := servers[0]
	nc, err := queue.Connect(context.Background(), queue.ConnOptions{URL: first.ClientURL(), Name: "test"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js := jetStream(t, nc)
	harness.Wait(t, "the JetStream cluster to form with 3 peers", func() (bool, error) {
		if _, err := js.AccountInfo(context.Background()); err != nil {
			return false, err
		}
		for _, ns := range servers { // only the meta leader answers with the peers
			if len(ns.JetStreamClusterPeers()) == 3 {
				return true, nil
			}
		}
		return false, nil
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
	streams := []string{cfg.Stream, queue.JobStream(cfg, job.DefaultTenant), cfg.DeadLetterStream, queue.DeadLetterStream(cfg, job.DefaultTenant), "KV_" + queue.CancelBucketOf(job.DefaultTenant), "KV_" + queue.ApprovalsBucket(cfg, job.DefaultTenant), "KV_" + queue.UsageBucketOf(job.DefaultTenant),
		"KV_" + queue.ProfilesBucket, "KV_" + queue.StatusBucket(cfg, job.DefaultTenant)}
	for _, name := range streams {
		s, err := js.Stream(ctx, name)
		if err != nil {
			t.Fatal(err)
		}
		if got := s.CachedInfo().Config.Replicas; got != 3 {
			t.Errorf("after worker setup with replicas 3, stream %s has %d replica(s), want 3", name, got)
		}
	}
	c, err := js.Consumer(ctx, queue.JobStream(cfg, job.DefaultTenant), cfg.Consumer+"-"+job.DefaultTenant)
	if err != nil {
		t.Fatal(err)
	}
	if got := c.CachedInfo().Config.Replicas; got != 3 {
		t.Errorf("after worker setup with replicas 3, consumer %s has %d replica(s), want 3", c.CachedInfo().Name, got)
	}
	// Three replicas in the config are three copies once both followers hold the data. Waiting
	// for that also ends the test after the followers made their stores: a nats-server shut
	// down while it makes one leaves that store's goroutines running (goleak's report).
	harness.Wait(t, "each stream and the consumer to have two current followers", func() (bool, error) {
		for _, name := range streams {
			s, err := js.Stream(ctx, name)
			if err != nil {
				return false, err
			}
			if err := twoCurrent(s.CachedInfo().Cluster); err != nil {
				return false, fmt.Errorf("stream %s: %w", name, err)
			}
		}
		ci, err := c.Info(ctx)
		if err != nil {
			return false, err
		}
		if err := twoCurrent(ci.Cluster); err != nil {
			return false, fmt.Errorf("consumer %s: %w", ci.Name, err)
		}
		return true, nil
	}, harness.Within(60*time.Second))
}

// twoCurrent says why a three-replica asset's cluster info does not show two followers caught
// up with its leader, or nil when it does.
func twoCurrent(ci *jetstream.ClusterInfo) error {
	if ci == nil || ci.Leader == "" {
		return errors.New("no leader")
	}
	current := 0
	for _, p := range ci.Replicas {
		if p.Current && !p.Offline {
			current++
		}
	}
	if current != 2 {
		return fmt.Errorf("leader %s, %d of its followers current", ci.Leader, current)
	}
	return nil
}
