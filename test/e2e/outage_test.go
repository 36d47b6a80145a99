//go:build integration

package e2e

import (
	"errors"
	"fmt"
	"net"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/boxcar-run/boxcar/internal/job"
	"github.com/boxcar-run/boxcar/internal/queue"
	"github.com/boxcar-run/boxcar/internal/queue/queuetest"
	"github.com/boxcar-run/boxcar/internal/store/s3test"
	"github.com/boxcar-run/boxcar/test/harness"
	"github.com/boxcar-run/boxcar/test/testworker"
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
	ns := queuetest.Start(t, queue.EmbeddedOptions{Host: "127.0.0.1", StoreDir: n.dir, SyncAlways: true})
	n.port = ns.Addr().(*net.TCPAddr).Port
	n.url = "nats://" + net.JoinHostPort("127.0.0.1", strconv.Itoa(n.port))
	ns.Shutdown()
	ns.WaitForShutdown()
	t.Cleanup(func() { n.stop() })
	return n
}

func (n *natsOnPort) up(t *testing.T) {
	t.Helper()
	n.srv = queuetest.Start(t, queue.EmbeddedOptions{Host: "127.0.0.1", Port: n.port, StoreDir: n.dir, SyncAlways: true})
}

func (n *natsOnPort) stop() {
	if n.srv != nil {
		n.srv.Shutdown()
		n.srv.WaitForShutdown()
		n.srv = nil
	}
}

// startConfigWorker launches a worker on natsURL and a file store, logging at debug level,
// without waiting for it to be ready.
func startConfigWorker(t *testing.T, natsURL, modelURL string) *worker {
	t.Helper()
	return launchWorker(t, testworker.Config{NATS: natsURL, Model: modelURL, Args: []string{"--log-level", "debug"}})
}

// launchWorker launches a worker with cfg and these tests' drain grace until the test ends,
// without waiting for it to be ready.
func launchWorker(t *testing.T, cfg testworker.Config) *worker {
	t.Helper()
	cfg.YAML += fmt.Sprintf("drain_grace: %s\n", workerDrainGrace)
	return &worker{testworker.Launch(t, cfg)}
}

// launchS3Worker launches a worker on natsURL (nats keys natsYAML) and a new bucket of s3,
// reached at endpoint (s3's own, or a proxy in front of it), with more store keys storeYAML;
// submit reaches s3 itself. It logs at debug level and is not waited for.
func launchS3Worker(t *testing.T, s3 *s3test.Server, endpoint, natsURL, natsYAML, storeYAML string) *worker {
	t.Helper()
	bucket := s3.CreateBucket(t)
	w := launchWorker(t, testworker.Config{NATS: natsURL, NATSYAML: natsYAML, Store: "s3://" + bucket,
		StoreYAML: fmt.Sprintf("endpoint: %s\nregion: %s\npath_style: true\n%s", endpoint, s3test.Region, storeYAML),
		Env:       s3.Vars(), Args: []string{"--log-level", "debug"}})
	w.Submit = w.Submit.With("BOXCAR_S3_ENDPOINT", s3.Endpoint)
	return w
}

// waitLog waits until the worker's log holds at least n lines matching re.
func (w *worker) waitLog(t *testing.T, re *regexp.Regexp, n int, within time.Duration) {
	t.Helper()
	harness.Wait(t, fmt.Sprintf("%d lines matching %s in the worker log", n, re), func() (bool, error) {
		if err := w.Alive(); err != nil {
			return false, err
		}
		got := w.Log.Count(re)
		return got >= n, fmt.Errorf("%d lines", got)
	}, harness.Within(within))
}

// notReady fails the test when the worker said it takes jobs.
func (w *worker) notReady(t *testing.T, why string) {
	t.Helper()
	select {
	case <-w.Ready():
		t.Errorf("the worker was ready %s", why)
	default:
	}
}

func (w *worker) submitJob(t *testing.T) (string, error) {
	return submitWith(t, w.Submit, "run", "--profile", "csv-analyst", "--task", "Summarise sales.csv",
		"--input", "../../examples/sales.csv", "--wait", "--timeout", "90s", "--output", "json")
}

// runJob submits a csv-analyst job and waits for it to succeed.
func (w *worker) runJob(t *testing.T) {
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
	harness.Wait(t, fmt.Sprintf("%s answers 503 matching %s", url, want), func() (bool, error) {
		body = waitHTTP(t, url, 503, within, alive)
		return want.MatchString(body), errors.New(body)
	}, harness.Within(within))
	return body
}

// TestWorkerWaitsForNATS: a worker whose NATS is not there yet waits for it instead of
// exiting, says why on /readyz, logs the wait once however many times it redials, and runs
// jobs once NATS comes; after losing NATS it does the same again.
func TestWorkerWaitsForNATS(t *testing.T) {
	t.Parallel()
	n := newNATSPort(t)
	w := startConfigWorker(t, n.url, demoModel(t))
	readyz := w.MetricsURL(t) + "/readyz"

	// Dialling goes on (debug lines), the wait is logged once, /readyz says why.
	retries := regexp.MustCompile(`"msg":"NATS still not reachable; dialling again"`)
	waits := regexp.MustCompile(`"level":"(WARN|INFO|ERROR)","msg":"[^"]*(NATS not reachable|waiting for)`)
	w.waitLog(t, retries, 3, 30*time.Second)
	waitReadyz(t, readyz, regexp.MustCompile(`^not ready: nats: not connected to `+regexp.QuoteMeta(n.url)+` \(\w+\): dial tcp .*connection refused`), 30*time.Second, w.Alive)
	if got := w.Log.Count(waits); got != 1 {
		t.Errorf("worker logged %d wait lines while NATS was down, want 1:\n%s", got, w.Log.String())
	}
	w.notReady(t, "without NATS")

	n.up(t)
	waitHTTP(t, readyz, 200, 30*time.Second, w.Alive)
	w.runJob(t)

	// Losing NATS under a running worker: not ready, one line, and back to work after.
	before := w.Log.Count(retries)
	n.stop()
	waitReadyz(t, readyz, regexp.MustCompile(`^not ready: nats: not connected to `+regexp.QuoteMeta(n.url)), 30*time.Second, w.Alive)
	w.waitLog(t, retries, before+3, 30*time.Second)
	lost := regexp.MustCompile(`"level":"WARN","msg":"lost the connection to NATS; reconnecting"`)
	if got := w.Log.Count(lost); got != 1 {
		t.Errorf("worker logged the lost connection %d times, want 1:\n%s", got, w.Log.String())
	}
	if got := w.Log.Count(regexp.MustCompile(`"level":"WARN","msg":"fetch failed`)); got > 1 {
		t.Errorf("worker logged %d failed fetches in one outage, want at most 1", got)
	}
	n.up(t)
	waitHTTP(t, readyz, 200, 30*time.Second, w.Alive)
	w.waitLog(t, regexp.MustCompile(`"msg":"connected to NATS"`), 2, 30*time.Second)
	w.runJob(t)

	// NATS back without its data (its storage lost): the worker sets the stream up again.
	n.stop()
	n.dir = t.TempDir()
	n.up(t)
	harness.Wait(t, "a job on the NATS that lost its data", func() (bool, error) {
		out, err := w.submitJob(t)
		if err == nil {
			if res := lastJSON(t, out); res["state"] != "succeeded" {
				t.Fatalf("job on the NATS that lost its data ended %v, want succeeded", res)
			}
			return true, nil
		}
		if !strings.Contains(err.Error()+out, "start a worker first") {
			t.Fatalf("submit to a NATS that lost its data, with a worker connected: %v\n%s", err, out)
		}
		return false, fmt.Errorf("%w\n%s", err, out)
	})
}

// TestStoreOutageKeepsTheDelivery: a job delivered while the store is down waits for it
// inside its attempt, its delivery kept alive past AckWait by in-progress acks, instead of
// being handed back at once and spending a delivery. With max_deliver 1 a delivery spent is
// a dead job; here the job succeeds on its first and only attempt once the store is back.
func TestStoreOutageKeepsTheDelivery(t *testing.T) {
	t.Parallel()
	s3 := s3test.Start(t)
	ns := startNATS(t)
	// Long enough that a busy machine's scheduling never misses three heartbeats in a row
	// (a third of it apart): at 2 s, a run under `make test` once lost the delivery to a
	// redelivery 47 ms after the store answered.
	const ackWait = 5 * time.Second
	w := launchS3Worker(t, s3, s3.Endpoint, ns.ClientURL(), fmt.Sprintf("ack_wait: %s\nmax_deliver: 1", ackWait), "")
	bucket := strings.TrimPrefix(w.Submit["BOXCAR_STORE"], "s3://")
	w.WaitReady(t)

	s3.Stop()
	// No inputs: submit cannot upload any while the store is down.
	out, err := submitWith(t, w.Submit, "run", "--profile", "csv-analyst", "--task", "Summarise", "--output", "json")
	if err != nil {
		t.Fatalf("submit: %v\n%s", err, out)
	}
	id := lastJSON(t, out)["id"].(string)
	s := waitStatus(t, w.Submit, id, 30*time.Second, func(s map[string]any) bool { return s["error"] != nil })
	if e, _ := s["error"].(string); s["state"] != "queued" || !strings.HasPrefix(e, "waiting for the store: it does not answer") || strings.Contains(e, bucket) {
		t.Errorf("status while the job waits for the store = %v, want queued, waiting in the tenant's words (the store's are the log's)", s)
	}
	w.waitLog(t, regexp.MustCompile(`"msg":"waiting for the store before the job can start; the delivery is kept","job_id":"`+id+`".*"error":"store: stat s3://`+bucket+`/tenants/default/runs/`+id+`/manifest.json`), 1, 30*time.Second)

	// The outage outlasts AckWait three times over: the delivery is kept, never redelivered.
	waitDeliveryKept(t, ns.ClientURL(), 3*ackWait)

	s3.Restart(t)
	done := waitStatus(t, w.Submit, id, 90*time.Second, func(s map[string]any) bool {
		return job.State(fmt.Sprint(s["state"])).Terminal()
	})
	if done["state"] != "succeeded" || done["attempt"] != float64(1) {
		t.Errorf("after the store came back: %v, want succeeded on attempt 1", done)
	}
	if dl, ok := deadLetter(t, ns.ClientURL(), id); ok {
		t.Errorf("a job that only waited for the store was dead-lettered: %+v", dl)
	}
	if n := w.Log.Count(regexp.MustCompile(`"msg":"the store answers; the job goes on","job_id":"` + id + `"`)); n != 1 {
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
	harness.Wait(t, fmt.Sprintf("the delivery kept alive past %s", span), func() (bool, error) {
		c, err := js.Consumer(t.Context(), "BOXCAR_JOBS_default", "boxcar-workers-default")
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
		return kept > span, fmt.Errorf("kept alive for %s", kept)
	}, harness.Within(span+time.Minute))
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
