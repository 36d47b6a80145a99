//go:build integration

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
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/boxcar-run/boxcar/examples"
	"github.com/boxcar-run/boxcar/internal/job"
	"github.com/boxcar-run/boxcar/internal/queue"
	"github.com/boxcar-run/boxcar/internal/store/s3test"
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
	submitEnv map[string]string
	log, out  *syncBuffer
	exit
}

// metricsURL is the base URL of the worker's /metrics, /healthz and /readyz. The worker binds
// port 0 and logs the address it got, before it waits for NATS or the store.
func (w *configWorker) metricsURL(t *testing.T) string {
	t.Helper()
	addr, _ := logged(t, w.log, "metrics listening", "addr", nil)
	return "http://" + addr
}

func startConfigWorker(t *testing.T, natsURL, modelURL string) *configWorker {
	t.Helper()
	storeDir := t.TempDir()
	return startWorkerWith(t, modelURL, fmt.Sprintf("nats:\n  url: %s\nstore:\n  url: file://%s\n", natsURL, storeDir),
		map[string]string{"NATS_URL": natsURL, "BOXCAR_STORE": "file://" + storeDir})
}

// startWorkerWith runs the worker with the example profiles, bubblewrap sandboxes and the
// nats and store sections given, until the test ends; submitEnv is how submit reaches them.
func startWorkerWith(t *testing.T, modelURL, sections string, submitEnv map[string]string) *configWorker {
	t.Helper()
	cfg := filepath.Join(t.TempDir(), "boxcar.yaml")
	writeText(t, cfg, string(examples.Config)+fmt.Sprintf("\ndrain_grace: %s\nsandbox:\n  backend: bubblewrap\n", workerDrainGrace)+sections)
	w := &configWorker{log: &syncBuffer{}, out: &syncBuffer{}, exit: newExit(), submitEnv: submitEnv}
	w.run(t, cfg, modelURL, "--log-level", "debug")
	return w
}

// run runs the worker on config file cfg against modelURL until the test ends, and logs what
// it wrote when the test failed.
func (w *configWorker) run(t *testing.T, cfg, modelURL string, args ...string) {
	t.Helper()
	env := mapEnv(map[string]string{"OPENAI_BASE_URL": modelURL, "OPENAI_API_KEY": e2eAPIKey})
	ctx, cancel := context.WithCancel(context.Background())
	go func() {
		w.done <- workercmd.Run(ctx, append([]string{"--config", cfg, "--metrics-addr", "127.0.0.1:0"}, args...), env, w.out, w.log)
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
	eventually(t, within, fmt.Sprintf("%d lines matching %s in the worker log", n, re), func() (bool, string) {
		if err := w.alive(); err != nil {
			t.Fatal(err)
		}
		got := w.count(re)
		return got >= n, fmt.Sprintf("%d lines", got)
	})
}

// workerReady matches the worker's JSON log record that it serves jobs.
var workerReady = regexp.MustCompile(`"msg":"worker ready"`)

func (w *configWorker) submitJob(t *testing.T) (string, error) {
	return submitWith(t, w.submitEnv, "run", "--profile", "csv-analyst", "--task", "Summarise sales.csv",
		"--input", "../../examples/sales.csv", "--wait", "--timeout", "90s", "--output", "json")
}

func (w *configWorker) count(re *regexp.Regexp) int { return len(re.FindAllString(w.log.String(), -1)) }

// runJob submits a csv-analyst job and waits for it to succeed.
func (w *configWorker) runJob(t *testing.T) {
	t.Helper()
	out, err := w.submitJob(t)
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
	var body string
	eventually(t, within, fmt.Sprintf("%s answers 503 matching %s", url, want), func() (bool, string) {
		body = waitHTTP(t, url, 503, within, alive)
		return want.MatchString(body), body
	})
	return body
}

// TestWorkerWaitsForNATS: a worker whose NATS is not there yet waits for it instead of
// exiting, says why on /readyz, logs the wait once however many times it redials, and runs
// jobs once NATS comes; after losing NATS it does the same again.
func TestWorkerWaitsForNATS(t *testing.T) {
	n := newNATSPort(t)
	w := startConfigWorker(t, n.url, demoModel(t))
	readyz := w.metricsURL(t) + "/readyz"

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

	// NATS back without its data (its storage lost): the worker sets the stream up again.
	n.stop()
	n.dir = t.TempDir()
	n.up(t)
	eventually(t, 60*time.Second, "a job on the NATS that lost its data", func() (bool, string) {
		out, err := w.submitJob(t)
		if err == nil {
			if res := lastJSON(t, out); res["state"] != "succeeded" {
				t.Fatalf("job on the NATS that lost its data ended %v, want succeeded", res)
			}
			return true, ""
		}
		if !strings.Contains(err.Error()+out, "start a worker first") {
			t.Fatalf("submit to a NATS that lost its data, with a worker connected: %v\n%s", err, out)
		}
		return false, fmt.Sprintf("%v\n%s", err, out)
	})
}

// TestStoreOutageKeepsTheDelivery: a job delivered while the store is down waits for it
// inside its attempt, its delivery kept alive past AckWait by in-progress acks, instead of
// being handed back at once and spending a delivery. With max_deliver 1 a delivery spent is
// a dead job; here the job succeeds on its first and only attempt once the store is back.
func TestStoreOutageKeepsTheDelivery(t *testing.T) {
	s3 := s3test.Start(t)
	bucket := s3.CreateBucket(t)
	s3.Env(t)
	ns := startNATS(t)
	const ackWait = 2 * time.Second
	w := startWorkerWith(t, demoModel(t), fmt.Sprintf("nats:\n  url: %s\n  ack_wait: %s\n  max_deliver: 1\nstore:\n  url: s3://%s\n  endpoint: %s\n  region: %s\n  path_style: true\n",
		ns.ClientURL(), ackWait, bucket, s3.Endpoint, s3test.Region),
		map[string]string{"NATS_URL": ns.ClientURL(), "BOXCAR_STORE": "s3://" + bucket, "BOXCAR_S3_ENDPOINT": s3.Endpoint})
	w.waitLog(t, workerReady, 1, 60*time.Second)

	s3.Stop()
	// No inputs: submit cannot upload any while the store is down.
	out, err := submitWith(t, w.submitEnv, "run", "--profile", "csv-analyst", "--task", "Summarise", "--output", "json")
	if err != nil {
		t.Fatalf("submit: %v\n%s", err, out)
	}
	id := lastJSON(t, out)["id"].(string)
	s := waitStatus(t, w.submitEnv, id, 30*time.Second, func(s map[string]any) bool { return s["error"] != nil })
	if e, _ := s["error"].(string); s["state"] != "queued" || !strings.HasPrefix(e, "waiting for the store: store: stat s3://"+bucket+"/runs/"+id+"/manifest.json") {
		t.Errorf("status while the job waits for the store = %v, want queued with the store error", s)
	}
	w.waitLog(t, regexp.MustCompile(`"msg":"waiting for the store before the job can start; the delivery is kept","job_id":"`+id+`"`), 1, 30*time.Second)

	// The outage outlasts AckWait three times over: the delivery is kept, never redelivered.
	waitDeliveryKept(t, ns.ClientURL(), 3*ackWait)

	s3.Restart(t)
	done := waitStatus(t, w.submitEnv, id, 90*time.Second, func(s map[string]any) bool {
		return job.State(fmt.Sprint(s["state"])).Terminal()
	})
	if done["state"] != "succeeded" || done["attempt"] != float64(1) {
		t.Errorf("after the store came back: %v, want succeeded on attempt 1", done)
	}
	if dl, ok := deadLetter(t, ns.ClientURL(), id); ok {
		t.Errorf("a job that only waited for the store was dead-lettered: %+v", dl)
	}
	if n := w.count(regexp.MustCompile(`"msg":"the store answers; the job goes on","job_id":"` + id + `"`)); n != 1 {
		t.Errorf("worker logged the end of the wait %d times, want 1", n)
	}
}

// waitDeliveryKept waits until the server has seen the one delivery in flight kept alive for
// longer than span: in-progress acks move its last activity on while it stays the first
// delivery. It fails at once when the job was delivered again or is no longer in flight, a
// delivery spent.
func waitDeliveryKept(t *testing.T, natsURL string, span time.Duration) {
	t.Helper()
	js, err := jetstream.New(natsConn(t, natsURL))
	if err != nil {
		t.Fatal(err)
	}
	var first time.Time
	eventually(t, span+time.Minute, fmt.Sprintf("the delivery kept alive past %s", span), func() (bool, string) {
		c, err := js.Consumer(t.Context(), "BOXCAR_JOBS", "boxcar-workers")
		if err != nil {
			t.Fatal(err)
		}
		ci := c.CachedInfo()
		if ci.NumRedelivered > 0 || ci.NumAckPending != 1 || ci.Delivered.Last == nil {
			t.Fatalf("while the job waits: %d redelivered, %d ack pending; want 0 and 1", ci.NumRedelivered, ci.NumAckPending)
		}
		if first.IsZero() {
			first = *ci.Delivered.Last
		}
		kept := ci.Delivered.Last.Sub(first)
		return kept > span, fmt.Sprintf("kept alive for %s", kept)
	})
}

func natsConn(t *testing.T, url string) *nats.Conn {
	t.Helper()
	nc, err := nats.Connect(url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	return nc
}
