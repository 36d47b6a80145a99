package e2e

import (
	"context"
	"fmt"
	"net"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"

	"github.com/boxcar-run/boxcar/examples"
	"github.com/boxcar-run/boxcar/internal/queue"
	"github.com/boxcar-run/boxcar/internal/workercmd"
)

// natsOnPort is a nats-server that can be stopped and started again on the same port and
// store folder, as an operator restarts one.
type natsOnPort struct {
	port int
	dir  string
	url  string
	srv  *server.Server
}

// newNATSPort picks a port by starting the server on a free one, then stops it: the test
// decides when NATS is there.
func newNATSPort(t *testing.T) *natsOnPort {
	t.Helper()
	n := &natsOnPort{dir: t.TempDir()}
	ns, err := queue.StartEmbedded(queue.EmbeddedOptions{Host: "127.0.0.1", Port: -1, StoreDir: n.dir, SyncAlways: true})
	if err != nil {
		t.Fatal(err)
	}
	n.port = ns.Addr().(*net.TCPAddr).Port
	n.url = "nats://" + net.JoinHostPort("127.0.0.1", strconv.Itoa(n.port))
	ns.Shutdown()
	ns.WaitForShutdown()
	t.Cleanup(func() { n.stop() })
	return n
}

func (n *natsOnPort) up(t *testing.T) {
	t.Helper()
	ns, err := queue.StartEmbedded(queue.EmbeddedOptions{Host: "127.0.0.1", Port: n.port, StoreDir: n.dir, SyncAlways: true})
	if err != nil {
		t.Fatalf("restart NATS on port %d: %v", n.port, err)
	}
	n.srv = ns
}

func (n *natsOnPort) stop() {
	if n.srv != nil {
		n.srv.Shutdown()
		n.srv.WaitForShutdown()
		n.srv = nil
	}
}

// configWorker runs the worker with the example profiles on a file store, the given NATS and
// log level debug, until the test ends; it does not wait for the worker to be ready.
type configWorker struct {
	metricsAddr string
	submitEnv   map[string]string
	log, out    *syncBuffer
	exit
}

func startConfigWorker(t *testing.T, natsURL, modelURL string) *configWorker {
	t.Helper()
	storeDir := t.TempDir()
	cfg := filepath.Join(t.TempDir(), "boxcar.yaml")
	writeText(t, cfg, string(examples.Config)+fmt.Sprintf(`
drain_grace: %s
nats:
  url: %s
store:
  url: file://%s
sandbox:
  backend: bubblewrap
`, workerDrainGrace, natsURL, storeDir))
	w := &configWorker{metricsAddr: freeAddr(t), log: &syncBuffer{}, out: &syncBuffer{}, exit: newExit(),
		submitEnv: map[string]string{"NATS_URL": natsURL, "BOXCAR_STORE": "file://" + storeDir}}
	env := mapEnv(map[string]string{"OPENAI_BASE_URL": modelURL, "OPENAI_API_KEY": e2eAPIKey})
	ctx, cancel := context.WithCancel(context.Background())
	go func() {
		w.done <- workercmd.Run(ctx, []string{"--config", cfg, "--metrics-addr", w.metricsAddr, "--log-level", "debug"}, env, w.out, w.log)
	}()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-w.done:
			if err != nil && !t.Failed() {
				t.Errorf("worker stopped with %v", err)
			}
		case <-time.After(60 * time.Second):
			t.Errorf("worker did not stop within 60s")
		}
		if t.Failed() {
			t.Logf("worker log:\n%s", w.log.String())
		}
	})
	return w
}

// exit carries a worker's Run error once it returns.
type exit struct{ done chan error }

func newExit() exit { return exit{done: make(chan error, 1)} }

// alive fails once the worker has exited.
func (e exit) alive() error {
	select {
	case err := <-e.done:
		e.done <- err
		return fmt.Errorf("the worker exited: %v", err)
	default:
		return nil
	}
}

// waitLog polls the worker's log until it holds at least n lines matching re.
func (w *configWorker) waitLog(t *testing.T, re *regexp.Regexp, n int, within time.Duration) {
	t.Helper()
	deadline := time.Now().Add(within)
	for len(re.FindAllString(w.log.String(), -1)) < n {
		if err := w.alive(); err != nil {
			t.Fatal(err)
		}
		if time.Now().After(deadline) {
			t.Fatalf("worker log holds %d lines matching %s within %s, want %d", len(re.FindAllString(w.log.String(), -1)), re, within, n)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func (w *configWorker) count(re *regexp.Regexp) int { return len(re.FindAllString(w.log.String(), -1)) }

// runJob submits a csv-analyst job and waits for it to succeed.
func (w *configWorker) runJob(t *testing.T) {
	t.Helper()
	out, err := submitWith(t, w.submitEnv, "run", "--profile", "csv-analyst", "--task", "Summarise sales.csv",
		"--input", "../../examples/sales.csv", "--wait", "--timeout", "90s", "--output", "json")
	if err != nil {
		t.Fatalf("submit run --wait: %v\n%s", err, out)
	}
	if res := lastJSON(t, out); res["state"] != "succeeded" {
		t.Fatalf("job ended %v, want succeeded", res)
	}
}

// waitReadyz polls url until it answers 503 with a body that matches want, and returns it.
func waitReadyz(t *testing.T, url string, want *regexp.Regexp, within time.Duration, alive func() error) string {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		body := waitHTTP(t, url, 503, within, alive)
		if want.MatchString(body) {
			return body
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s answered %q, want it to match %s", url, body, want)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestWorkerWaitsForNATS: a worker whose NATS is not there yet waits for it instead of
// exiting, says why on /readyz, logs the wait once however many times it redials, and runs
// jobs once NATS comes; after losing NATS it does the same again.
func TestWorkerWaitsForNATS(t *testing.T) {
	n := newNATSPort(t)
	w := startConfigWorker(t, n.url, demoModel(t))
	readyz := "http://" + w.metricsAddr + "/readyz"

	// Dialling goes on (debug lines), the wait is logged once, /readyz says why.
	retries := regexp.MustCompile(`"msg":"NATS still not reachable; dialling again"`)
	waits := regexp.MustCompile(`"level":"(WARN|INFO|ERROR)","msg":"[^"]*(NATS not reachable|waiting for)`)
	w.waitLog(t, retries, 3, 30*time.Second)
	waitReadyz(t, readyz, regexp.MustCompile(`^not ready: nats: not connected to `+regexp.QuoteMeta(n.url)+` \(\w+\): dial tcp .*connection refused`), 30*time.Second, w.alive)
	if got := w.count(waits); got != 1 {
		t.Errorf("worker logged %d wait lines while NATS was down, want 1:\n%s", got, w.log.String())
	}
	if strings.Contains(w.out.String(), "worker ready") {
		t.Errorf("worker said it was ready without NATS: %s", w.out.String())
	}

	n.up(t)
	waitHTTP(t, readyz, 200, 30*time.Second, w.alive)
	w.runJob(t)

	// Losing NATS under a running worker: not ready, one line, and back to work after.
	before := w.count(retries)
	n.stop()
	waitReadyz(t, readyz, regexp.MustCompile(`^not ready: nats: not connected to `+regexp.QuoteMeta(n.url)), 30*time.Second, w.alive)
	w.waitLog(t, retries, before+3, 30*time.Second)
	lost := regexp.MustCompile(`"level":"WARN","msg":"lost the connection to NATS; reconnecting"`)
	if got := w.count(lost); got != 1 {
		t.Errorf("worker logged the lost connection %d times, want 1:\n%s", got, w.log.String())
	}
	if got := w.count(regexp.MustCompile(`"level":"WARN","msg":"fetch failed`)); got > 1 {
		t.Errorf("worker logged %d failed fetches in one outage, want at most 1", got)
	}
	n.up(t)
	waitHTTP(t, readyz, 200, 30*time.Second, w.alive)
	w.waitLog(t, regexp.MustCompile(`"msg":"connected to NATS"`), 2, 30*time.Second)
	w.runJob(t)
}
