//go:build faults

package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	testharness "github.com/boxcar-run/boxcar/test/harness"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// The cluster run's settings.
const (
	clusterNodes = 3
	// submitters is how many `submit run` commands run at once, as a few users or a script's
	// parallel loop would.
	submitters = 3
	// minNodeKills is how many node kills the schedule makes at least; it goes on killing while
	// submissions are still going.
	minNodeKills = 4
	// nodeDown is how long a killed node stays down: long enough for its streams and consumers
	// to elect new leaders while submissions go on.
	nodeDown = 3 * time.Second
)

// aimedStreams are the streams whose leader the schedule kills, in turn: the two that every
// `submit run` reads and writes.
var aimedStreams = []string{"BOXCAR_JOBS_default", "KV_BOXCAR_STATUS_default"}

// natsCluster is three nats-server processes routed to each other over loopback, each with its
// own JetStream store.
type natsCluster struct {
	dir   string
	nodes [clusterNodes]*testharness.Process
	// clients and routes are the addresses each node listens on, read back from the server.
	clients, routes [clusterNodes]string
}

func nodeName(i int) string { return fmt.Sprintf("faults-n%d", i) }

func (c *natsCluster) stop() {
	if c == nil {
		return
	}
	for _, n := range c.nodes {
		_ = n.Stop(stopGrace)
	}
}

// urls is every node's client URL, as a client's server list.
func (c *natsCluster) urls() string {
	var us []string
	for _, a := range c.clients {
		us = append(us, "nats://"+a)
	}
	return strings.Join(us, ",")
}

// startCluster starts the three nodes. Each route names its peers' addresses, which must be
// known before any node starts, so the addresses are found first: each node binds port 0
// (client and route) without JetStream and writes what it bound to its ports file; those are
// stopped, and the cluster starts on the addresses read back. A node restarted later binds the
// same addresses, as an operator's restarted node keeps its own.
func (h *harness) startCluster() error {
	c := h.cluster
	natsBin, err := lookBin("nats-server")
	if err != nil {
		return err
	}
	for i := range c.nodes {
		if c.clients[i], c.routes[i], err = c.probe(natsBin, i); err != nil {
			return err
		}
	}
	for i := range c.nodes {
		conf, err := c.writeConf(i)
		if err != nil {
			return err
		}
		c.nodes[i] = &testharness.Process{Name: nodeName(i), Path: natsBin, Args: []string{"-c", conf}, Log: filepath.Join(c.dir, nodeName(i)+".log")}
		if err := c.nodes[i].Start(context.Background()); err != nil {
			return err
		}
	}
	h.natsURL = c.urls()
	return h.waitNATS()
}

// probe starts node i on ports the kernel picks and returns the client and route addresses it
// bound, read from its ports file.
func (c *natsCluster) probe(natsBin string, i int) (client, route string, err error) {
	portsDir := filepath.Join(c.dir, "ports", nodeName(i))
	if err := os.MkdirAll(portsDir, 0o700); err != nil {
		return "", "", err
	}
	conf := filepath.Join(c.dir, nodeName(i)+"-probe.conf")
	text := fmt.Sprintf("server_name: %s\nlisten: 127.0.0.1:-1\nports_file_dir: %q\ncluster {\n  Name: faults\n  listen: 127.0.0.1:-1\n}\n", nodeName(i), portsDir)
	if err := os.WriteFile(conf, []byte(text), 0o600); err != nil {
		return "", "", err
	}
	p := &testharness.Process{Name: nodeName(i) + " (probe)", Path: natsBin, Args: []string{"-c", conf}, Log: filepath.Join(c.dir, nodeName(i)+".log")}
	if err := p.Start(context.Background()); err != nil {
		return "", "", err
	}
	defer func() { _ = p.Stop(stopGrace) }()
	var ports struct{ Nats, Cluster []string }
	err = poll(30*time.Second, p.Name+" to write its ports file", func() bool {
		files, _ := filepath.Glob(filepath.Join(portsDir, "*.ports"))
		if len(files) == 0 {
			return false
		}
		b, err := os.ReadFile(files[0])
		return err == nil && json.Unmarshal(b, &ports) == nil && len(ports.Nats) > 0 && len(ports.Cluster) > 0
	})
	if err != nil {
		return "", "", err
	}
	return strings.TrimPrefix(ports.Nats[0], "nats://"), strings.TrimPrefix(ports.Cluster[0], "nats://"), nil
}

// writeConf writes node i's configuration: its addresses, routes to the other two, and a
// JetStream store of its own that syncs every write, as the single-server run's does.
func (c *natsCluster) writeConf(i int) (string, error) {
	var routes []string
	for j, r := range c.routes {
		if j != i {
			routes = append(routes, "nats-route://"+r)
		}
	}
	text := fmt.Sprintf("server_name: %s\nlisten: %s\ncluster {\n  Name: faults\n  listen: %s\n  routes: [%s]\n}\n"+
		"jetstream {\n  store_dir: %q\n  sync_interval: always\n}\n",
		nodeName(i), c.clients[i], c.routes[i], strings.Join(routes, ", "), filepath.Join(c.dir, nodeName(i)))
	conf := filepath.Join(c.dir, nodeName(i)+".conf")
	return conf, os.WriteFile(conf, []byte(text), 0o600)
}

func (h *harness) replicas() int {
	if h.cluster != nil {
		return clusterNodes
	}
	return 1
}

// submissions counts `submit run` commands and the ones that failed, by their last line.
type submissions struct {
	mu       sync.Mutex
	sent     int
	failed   map[string]int
	failedID map[string]bool
}

// runCluster is the --cluster run: n jobs, each its own `submit run`, while one node at a time
// is killed and restarted. It fails when a submission failed, besides the invariants of the
// final state.
func (h *harness) runCluster(n int) error {
	if err := h.waitStream(); err != nil {
		return err
	}
	elections, stopCounting, err := h.countElections()
	if err != nil {
		return err
	}
	defer stopCounting()
	start := time.Now()
	ids := jobIDs("faults-cluster", n)
	subs := &submissions{failed: map[string]int{}, failedID: map[string]bool{}}
	done := make(chan struct{})
	go func() { h.submitEach(ids, subs); close(done) }()
	kills, err := h.killNodes(done)
	if err != nil {
		return err
	}
	<-done
	checked, stranded := h.checkable(ids, subs)
	_, res, err := h.finish(checked)
	if err != nil {
		return err
	}
	failed := len(subs.failedID)
	msgs := make([]string, 0, len(subs.failed))
	for m := range subs.failed {
		msgs = append(msgs, m)
	}
	sort.Strings(msgs)
	for _, m := range msgs {
		fmt.Fprintf(os.Stderr, "faults: SUBMIT FAILED %d× %s\n", subs.failed[m], m)
	}
	fmt.Printf("faults cluster: %d submissions, failed %d (%d left queued), leader elections %d, node kills %d, committed %d, dead %d, lost %d, duplicates %d, orphans %d, redelivered %d\n",
		subs.sent, failed, stranded, elections.Load(), kills, res.committed, res.dead, res.lost, res.duplicates, res.orphans, res.redelivered)
	fmt.Fprintf(os.Stderr, "faults: wall time %s\n", time.Since(start).Round(time.Second))
	if elections.Load() == 0 {
		res.wrong++
		fmt.Fprintln(os.Stderr, "faults: AIM no leader election seen: the node kills missed the streams' leaders")
	}
	if err := h.verdict(res); err != nil {
		return err
	}
	if failed > 0 {
		return fmt.Errorf("%d of %d submissions failed; see the lines above, logs in %s", failed, subs.sent, h.dir)
	}
	return nil
}

// submitEach submits every id with its own `submit run`, submitters at a time, as users do;
// a failed one is counted and not retried: the user saw it fail.
func (h *harness) submitEach(ids []string, subs *submissions) {
	next := make(chan int)
	var wg sync.WaitGroup
	for range submitters {
		wg.Go(func() {
			for i := range next {
				out, err := h.submit("run", "--id", ids[i], "--profile", "csv-analyst",
					"--task", fmt.Sprintf("Summarise sales.csv (job %d)", i), "--input", "examples/sales.csv")
				subs.mu.Lock()
				subs.sent++
				if err != nil {
					subs.failed[fmt.Sprintf("%v: %s", err, lastLines(out, 1))]++
					subs.failedID[ids[i]] = true
				}
				subs.mu.Unlock()
			}
		})
	}
	for i := range ids {
		next <- i
	}
	close(next)
	wg.Wait()
}

// checkable is the jobs whose final state is checked: every submission that succeeded, and
// those that failed but whose job reached the stream all the same, which have run once the
// others have. stranded counts failed ones whose status says queued with no job behind it.
func (h *harness) checkable(ids []string, subs *submissions) (checked []string, stranded int) {
	for _, id := range ids {
		if !subs.failedID[id] {
			checked = append(checked, id)
		}
	}
	if len(subs.failedID) == 0 || h.drain(checked) != nil {
		return checked, 0 // finish drains again and reports what is not final
	}
	st, err := h.statuses()
	if err != nil {
		fmt.Fprintln(os.Stderr, "faults: read the statuses of failed submissions:", err)
	}
	for _, id := range ids {
		s, found := st[id]
		switch {
		case !subs.failedID[id] || !found:
		case s.State.Terminal():
			checked = append(checked, id)
		default:
			stranded++
			fmt.Fprintf(os.Stderr, "faults: STRANDED %s: its submission failed and its status says %s\n", id, s.State)
		}
	}
	return checked, stranded
}

// killNodes kills one node at a time, SIGKILL, the leader of each aimed stream in turn, keeps
// it down for nodeDown and restarts it, waiting for the cluster to be whole again before the
// next. It goes on until submissions are done and it has killed minNodeKills.
func (h *harness) killNodes(done <-chan struct{}) (int, error) {
	kills := 0
	for ; kills < minNodeKills || !closed(done); kills++ {
		time.Sleep(2 * time.Second)
		stream := aimedStreams[kills%len(aimedStreams)]
		i := h.leaderOf(stream)
		if i < 0 {
			i = kills % clusterNodes
		}
		h.faults++
		fmt.Fprintf(os.Stderr, "faults: kill -9 %s (leader of %s), restart it after %s\n", nodeName(i), stream, nodeDown)
		node := h.cluster.nodes[i]
		node.Kill()
		time.Sleep(nodeDown)
		if err := node.Start(context.Background()); err != nil {
			return kills, err
		}
		if err := poll(2*time.Minute, nodeName(i)+" to catch up", h.clusterWhole); err != nil {
			return kills, err
		}
		if err := h.alive(); err != nil {
			return kills, err
		}
	}
	return kills, nil
}

func closed(c <-chan struct{}) bool {
	select {
	case <-c:
		return true
	default:
		return false
	}
}

// leaderOf returns the index of the node that leads stream, or -1 when that cannot be read.
func (h *harness) leaderOf(stream string) int {
	nc, js, err := h.connect()
	if err != nil {
		return -1
	}
	defer nc.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	s, err := js.Stream(ctx, stream)
	if err != nil {
		return -1
	}
	info := s.CachedInfo()
	for i := range clusterNodes {
		if info.Cluster != nil && info.Cluster.Leader == nodeName(i) {
			return i
		}
	}
	return -1
}

// clusterWhole reports whether every stream and the workers' consumer have a leader and every
// replica is online and current.
func (h *harness) clusterWhole() bool {
	nc, js, err := h.connect()
	if err != nil {
		return false
	}
	defer nc.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	whole := func(ci *jetstream.ClusterInfo) bool {
		if ci == nil || ci.Leader == "" || len(ci.Replicas) != clusterNodes-1 {
			return false
		}
		for _, r := range ci.Replicas {
			if !r.Current || r.Offline {
				return false
			}
		}
		return true
	}
	streams := js.ListStreams(ctx)
	n := 0
	for info := range streams.Info() {
		n++
		if !whole(info.Cluster) {
			return false
		}
	}
	if streams.Err() != nil || n == 0 {
		return false
	}
	cons, err := js.Consumer(ctx, "BOXCAR_JOBS_default", "boxcar-workers-default")
	if err != nil {
		return false
	}
	ci, err := cons.Info(ctx)
	return err == nil && whole(ci.Cluster)
}

// countElections counts the leader elections of streams and consumers the cluster announces
// (JetStream's advisories) until stop is called.
func (h *harness) countElections() (*atomic.Int64, func(), error) {
	var n atomic.Int64
	nc, err := nats.Connect(h.natsURL, nats.MaxReconnects(-1), nats.ReconnectWait(100*time.Millisecond))
	if err != nil {
		return nil, nil, fmt.Errorf("connect to count leader elections: %w", err)
	}
	_, err = nc.Subscribe("$JS.EVENT.ADVISORY.>", func(m *nats.Msg) {
		if strings.Contains(m.Subject, ".LEADER_ELECTED") {
			n.Add(1)
		}
	})
	if err == nil {
		err = nc.Flush()
	}
	if err != nil {
		nc.Close()
		return nil, nil, fmt.Errorf("subscribe to JetStream's advisories: %w", err)
	}
	return &n, nc.Close, nil
}
