//go:build faults

// Command faults is Boxcar's own fault-injection test (`make test-faults`). It runs a real
// nats-server (file storage, sync_interval always), a real versitygw, the scripted model and
// two worker processes with bubblewrap sandboxes; submits jobs with bin/submit while it kills,
// pauses and restarts them; drains; stops the model for a while with jobs queued and running
// (model.go); and checks from the final state that every job ended exactly once. It prints one line and exits 1 when an invariant does not hold:
//
//	faults: N jobs, F faults, committed C, dead D, lost 0, duplicates 0, orphans 0, redelivered R
//
// With --cluster the run is against a 3-node JetStream cluster instead (streams and buckets at
// replicas 3): jobs go in one `submit run` each while the nodes are killed one at a time, and
// the run also fails when a submission did (cluster.go):
//
//	faults cluster: N submissions, failed 0, leader elections E, node kills K, committed C, dead D, lost 0, duplicates 0, orphans 0, redelivered R
//
// Usage: go run ./test/faults [--bin DIR] [--jobs N] [--cluster] [--keep]
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log"
	"maps"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/boxcar-run/boxcar/examples"
	"github.com/boxcar-run/boxcar/internal/job"
	"github.com/boxcar-run/boxcar/internal/provenance"
	"github.com/boxcar-run/boxcar/internal/testnet"
	testharness "github.com/boxcar-run/boxcar/test/harness"
)

// The run's settings: short enough that redeliveries and exhausted jobs happen within minutes.
const (
	ackWait     = 5 * time.Second
	maxDeliver  = 3
	concurrency = 3
	bucket      = "boxcar-faults"
	accessKey   = "faultsaccess"
	secretKey   = "faultssecret1234"
	drainWithin = 4 * time.Minute
	submitWave  = 5
	submitEvery = 2 * time.Second
	exhaustJobs = 6
	modelDelay  = 500 * time.Millisecond
)

func main() {
	bin := flag.String("bin", "bin", "folder with worker, submit and demo-model")
	jobs := flag.Int("jobs", 200, "jobs to submit")
	keep := flag.Bool("keep", false, "keep the temporary folder (logs, store, NATS data)")
	cluster := flag.Bool("cluster", false, "run on a 3-node JetStream cluster, killing one node at a time")
	flag.Parse()
	h, err := newHarness(*bin, *keep, *cluster)
	switch {
	case err == nil && *cluster:
		err = h.runCluster(*jobs)
	case err == nil:
		err = h.run(*jobs)
	}
	if h != nil {
		h.keep = h.keep || err != nil // its logs are named in the failure
		h.close()
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "faults:", err)
		os.Exit(1)
	}
}

type harness struct {
	bin, dir, natsURL, s3Endpoint, modelURL string
	keep                                    bool
	nats, gw, model                         *testharness.Process
	// cluster is the 3-node NATS cluster of a --cluster run, in place of nats.
	cluster *natsCluster
	workers [2]*testharness.Process
	// proxy stands between worker 1 and versitygw, to pause that worker mid-upload.
	proxy   *storeProxy
	faults  int
	lastIDs []string
	// paused are the uploads worker 1 was stopped in while another attempt committed.
	paused []upload
	// lastDelivery are the jobs on their last delivery when every worker was killed and
	// kept down past AckWait.
	lastDelivery []string
}

func newHarness(bin string, keep, cluster bool) (*harness, error) {
	abs, err := filepath.Abs(bin)
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "boxcar-faults-")
	if err != nil {
		return nil, err
	}
	// Sandboxes run as unprivileged users that must reach their workdirs under dir.
	if err := os.Chmod(dir, 0o711); err != nil {
		return nil, err
	}
	h := &harness{bin: abs, dir: dir, keep: keep}
	if cluster {
		h.cluster = &natsCluster{dir: filepath.Join(dir, "cluster")}
	}
	if err := h.startAll(); err != nil {
		return h, err
	}
	return h, nil
}

func (h *harness) close() {
	for _, p := range []*testharness.Process{h.workers[0], h.workers[1], h.model, h.gw, h.nats} {
		_ = p.Stop(stopGrace)
	}
	h.cluster.stop()
	if h.keep {
		fmt.Fprintln(os.Stderr, "faults: kept", h.dir)
		return
	}
	_ = os.RemoveAll(h.dir)
}

func (h *harness) startAll() error {
	start := h.startSingleNATS
	if h.cluster != nil {
		start = h.startCluster
	}
	if err := start(); err != nil {
		return err
	}
	return h.startRest()
}

func (h *harness) startSingleNATS() error {
	// Each server binds port 0 first and the address is read back; a restart binds that
	// address again, as an operator's restarted server keeps its address.
	natsConf := filepath.Join(h.dir, "nats.conf")
	writeConf := func(addr string) error {
		conf := fmt.Sprintf("listen: %s\nserver_name: faults\njetstream {\n  store_dir: %q\n  sync_interval: always\n}\n", addr, filepath.Join(h.dir, "nats"))
		return os.WriteFile(natsConf, []byte(conf), 0o600)
	}
	if err := writeConf("127.0.0.1:-1"); err != nil {
		return err
	}
	natsBin, err := lookBin("nats-server")
	if err != nil {
		return err
	}
	h.nats = &testharness.Process{Name: "nats-server", Path: natsBin, Args: []string{"-c", natsConf}, Log: filepath.Join(h.dir, "nats.log")}
	if err := h.nats.Start(context.Background()); err != nil {
		return err
	}
	natsAddr, err := listeningAddr(h.nats)
	if err != nil {
		return err
	}
	h.natsURL = "nats://" + natsAddr
	if err := writeConf(natsAddr); err != nil {
		return err
	}
	return h.waitNATS()
}

// startRest starts versitygw, the model and the workers, once NATS is up.
func (h *harness) startRest() error {
	gwDir := filepath.Join(h.dir, "s3")
	if err := os.MkdirAll(filepath.Join(gwDir, bucket), 0o700); err != nil {
		return err
	}
	gwBin, err := lookBin("versitygw")
	if err != nil {
		return err
	}
	h.gw = &testharness.Process{Name: "versitygw", Path: gwBin, Log: filepath.Join(h.dir, "versitygw.log"),
		Args: []string{"--access", accessKey, "--secret", secretKey, "--region", "us-east-1",
			"--port", "127.0.0.1:0", "--health", "/health", "--keep-alive", "--quiet", "posix", gwDir},
		Env: []string{"ROOT_ACCESS_KEY_ID=", "ROOT_SECRET_ACCESS_KEY="}}
	if err := h.gw.Start(context.Background()); err != nil {
		return err
	}
	gwAddr, err := listeningAddr(h.gw)
	if err != nil {
		return err
	}
	h.s3Endpoint = "http://" + gwAddr
	h.gw.Args[7] = gwAddr
	if err := h.waitGW(); err != nil {
		return err
	}
	if h.proxy, err = newStoreProxy(h.s3Endpoint); err != nil {
		return err
	}

	urlFile := filepath.Join(h.dir, "model-url")
	h.model = &testharness.Process{Name: "demo-model", Path: filepath.Join(h.bin, "demo-model"), Args: []string{"--addr", "127.0.0.1:0", "--addr-file", urlFile}, Log: filepath.Join(h.dir, "model.log")}
	if err := h.model.Start(context.Background()); err != nil {
		return err
	}
	if err := poll(30*time.Second, "the demo model's address file", func() bool {
		b, err := os.ReadFile(urlFile)
		h.modelURL = strings.TrimSpace(string(b))
		return err == nil && h.modelURL != ""
	}); err != nil {
		return err
	}

	// Each model answer takes modelDelay, so a job runs for a few seconds, as a real one does,
	// and a kill or a pause finds it mid-run rather than between jobs.
	proxyURL, err := delayProxy(h.modelURL, modelDelay)
	if err != nil {
		return err
	}
	for i := range h.workers {
		cfg := filepath.Join(h.dir, fmt.Sprintf("worker%d.yaml", i))
		endpoint := h.s3Endpoint
		if i == 1 {
			endpoint = h.proxy.url
		}
		sections := fmt.Sprintf("\nworker_id: faults-w%d\nconcurrency: %d\ndrain_grace: 5s\n"+
			"nats:\n  url: %s\n  ack_wait: %s\n  max_deliver: %d\n  retry_backoff: 1s\n  replicas: %d\n"+
			"store:\n  url: s3://%s\n  endpoint: %s\n  path_style: true\n"+
			"sandbox:\n  backend: bubblewrap\n  bubblewrap:\n    root: %s\n",
			i, concurrency, h.natsURL, ackWait, maxDeliver, h.replicas(), bucket, endpoint, h.sandboxRoot())
		text := strings.Replace(string(examples.Config), "concurrency: 2\n", "", 1) + sections
		if err := os.WriteFile(cfg, []byte(text), 0o600); err != nil {
			return err
		}
		h.workers[i] = &testharness.Process{Name: fmt.Sprintf("worker %d", i), Path: filepath.Join(h.bin, "worker"),
			Args: []string{"--config", cfg, "--metrics-addr", "127.0.0.1:0", "--log-level", "debug"},
			Log:  filepath.Join(h.dir, fmt.Sprintf("worker%d.log", i)),
			Env:  append(h.s3Env(), "OPENAI_BASE_URL="+proxyURL, "OPENAI_API_KEY=faults-not-a-key")}
		if err := h.workers[i].Start(context.Background()); err != nil {
			return err
		}
	}
	return h.alive()
}

// alive fails, with the end of its log, when a worker has exited on its own.
func (h *harness) alive() error {
	for _, w := range h.workers {
		select {
		case <-w.Done():
			b, _ := os.ReadFile(w.Log)
			return fmt.Errorf("%s exited: %s", w.Name, lastLines(b, 5))
		default:
		}
	}
	return nil
}

// delayProxy serves target (the model's base URL) on loopback, each request delayed by d.
func delayProxy(target string, d time.Duration) (string, error) {
	return reverseProxy(target, func(rp *httputil.ReverseProxy) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			select {
			case <-time.After(d):
			case <-r.Context().Done():
				return
			}
			rp.ServeHTTP(w, r)
		})
	})
}

// reverseProxy serves target's host on a port of 127.0.0.1 the kernel picks and returns the
// proxy's URL, with target's path. handler gets the reverse proxy before anything is served, to
// adjust it and to return what serves each request (passing it on to the proxy or not). Both
// proxies of the harness are made here, so they listen and log alike.
func reverseProxy(target string, handler func(*httputil.ReverseProxy) http.Handler) (string, error) {
	u, err := url.Parse(target)
	if err != nil {
		return "", err
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	rp := httputil.NewSingleHostReverseProxy(&url.URL{Scheme: u.Scheme, Host: u.Host})
	rp.ErrorLog = log.New(io.Discard, "", 0) // a killed worker's request is not news
	srv := &http.Server{ReadHeaderTimeout: 10 * time.Second, Handler: handler(rp)}
	go func() { _ = srv.Serve(ln) }()
	return "http://" + ln.Addr().String() + u.Path, nil
}

func (h *harness) sandboxRoot() string { return filepath.Join(h.dir, "sandboxes") }

func (h *harness) s3Env() []string {
	return []string{"AWS_ACCESS_KEY_ID=" + accessKey, "AWS_SECRET_ACCESS_KEY=" + secretKey, "AWS_REGION=us-east-1",
		"AWS_CONFIG_FILE=/dev/null", "AWS_SHARED_CREDENTIALS_FILE=/dev/null"}
}

func (h *harness) startNATS() error { return startAndWait(h.nats, h.waitNATS) }

// startAndWait starts p and waits until wait says it serves.
func startAndWait(p *testharness.Process, wait func() error) error {
	if err := p.Start(context.Background()); err != nil {
		return err
	}
	return wait()
}

func (h *harness) waitNATS() error {
	return poll(30*time.Second, "nats-server", func() bool {
		nc, err := nats.Connect(h.natsURL, nats.Timeout(time.Second))
		if err != nil {
			return false
		}
		defer nc.Close()
		js, err := jetstream.New(nc)
		if err != nil {
			return false
		}
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		_, err = js.AccountInfo(ctx)
		return err == nil
	})
}

func (h *harness) startGW() error { return startAndWait(h.gw, h.waitGW) }

func (h *harness) waitGW() error {
	return poll(30*time.Second, "versitygw", func() bool {
		c, err := net.DialTimeout("tcp", strings.TrimPrefix(h.s3Endpoint, "http://"), time.Second)
		if err == nil {
			c.Close()
		}
		return err == nil
	})
}

// submit runs bin/submit with NATS and the store of this run.
func (h *harness) submit(args ...string) ([]byte, error) {
	cmd := exec.Command(filepath.Join(h.bin, "submit"), args...)
	cmd.Env = append(os.Environ(), h.s3Env()...)
	cmd.Env = append(cmd.Env, "NATS_URL="+h.natsURL, "BOXCAR_STORE=s3://"+bucket, "BOXCAR_S3_ENDPOINT="+h.s3Endpoint)
	cmd.Dir = h.repoDir()
	return cmd.CombinedOutput()
}

func (h *harness) repoDir() string { return filepath.Dir(h.bin) }

func (h *harness) run(n int) error {
	ids := jobIDs("faults", n)
	if err := h.waitStream(); err != nil {
		return err
	}
	start := time.Now()
	// Jobs go in waves over the whole fault schedule, so every fault finds jobs in flight.
	submitted := make(chan error, 1)
	go func() { submitted <- h.submitWaves(ids, submitEvery) }()
	if err := h.inject(submitted); err != nil {
		return err
	}
	ids, res, err := h.finish(append(ids, h.lastIDs...))
	if err != nil {
		return err
	}
	fmt.Printf("faults: %d jobs, %d faults, committed %d, dead %d, lost %d, duplicates %d, orphans %d, redelivered %d\n",
		len(ids), h.faults, res.committed, res.dead, res.lost, res.duplicates, res.orphans, res.redelivered)
	fmt.Fprintf(os.Stderr, "faults: wall time %s\n", time.Since(start).Round(time.Second))
	return h.verdict(res)
}

// jobIDs names n jobs of this run.
func jobIDs(prefix string, n int) []string {
	ids := make([]string, n)
	stamp := time.Now().UTC().Format("150405")
	for i := range ids {
		ids[i] = fmt.Sprintf("%s-%s-%04d", prefix, stamp, i)
	}
	return ids
}

// waitStream waits for a worker to set up the job stream, which submit needs.
func (h *harness) waitStream() error {
	if err := poll(60*time.Second, "a worker to set up the job stream", func() bool {
		nc, js, err := h.connect()
		if err != nil {
			return false
		}
		defer nc.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		_, err = js.Consumer(ctx, "BOXCAR_JOBS_default", "boxcar-workers-default")
		return err == nil || h.alive() != nil
	}); err != nil {
		return err
	}
	return h.alive()
}

// finish drains, stops the model for a while (the single-server run only), stops the workers
// and checks the final state of ids and the outage's jobs; it returns the ids it checked.
func (h *harness) finish(ids []string) ([]string, result, error) {
	if err := h.drain(ids); err != nil {
		fmt.Fprintln(os.Stderr, "faults: drain:", err)
	}
	outageWrong := 0
	if h.cluster == nil {
		outage, wrong, err := h.modelOutage()
		ids, outageWrong = append(ids, outage...), wrong
		if err != nil {
			outageWrong++
			fmt.Fprintln(os.Stderr, "faults: model outage:", err)
		}
	}
	// Stop the workers as an operator would, then look for sandboxes they left behind.
	for _, w := range h.workers {
		_ = w.Stop(stopGrace)
	}
	res, err := h.check(ids)
	res.wrong += outageWrong
	return ids, res, err
}

// verdict fails the run when an invariant of the final state does not hold.
func (h *harness) verdict(res result) error {
	if res.lost+res.duplicates+res.orphans+res.verifyFailed+res.stuck+res.wrong > 0 {
		return fmt.Errorf("invariants do not hold (%d verify failures, %d left in the consumer, %d other); see the lines above, logs in %s", res.verifyFailed, res.stuck, res.wrong, h.dir)
	}
	return nil
}

// inject runs the fault schedule. Worker kills go on every few seconds throughout; the other
// faults come once each, in an order that leaves room for jobs to run between them.
func (h *harness) inject(submitted <-chan error) error {
	step := func(what string, f func() error) error {
		h.faults++
		fmt.Fprintf(os.Stderr, "faults: %s\n", what)
		return f()
	}
	for _, f := range h.schedule() {
		time.Sleep(f.after)
		if err := step(f.what, f.do); err != nil {
			return err
		}
	}
	time.Sleep(4 * time.Second)
	if err := <-submitted; err != nil {
		return err
	}
	return h.exhaust(step)
}

// fault is one step of the schedule: after a pause, what to do and its line on stderr.
type fault struct {
	after time.Duration
	what  string
	do    func() error
}

// schedule is the faults in order: four worker kills, NATS killed, versitygw stopped, the
// paused upload, four more worker kills, NATS killed again.
func (h *harness) schedule() []fault {
	workerKills := func(every time.Duration) []fault {
		var fs []fault
		for i := range 4 {
			w := h.workers[i%2]
			fs = append(fs, fault{every, fmt.Sprintf("SIGKILL worker %d and restart it", i%2), func() error {
				w.Kill()
				time.Sleep(time.Second)
				return w.Start(context.Background())
			}})
		}
		return fs
	}
	natsKill := fault{0, "kill -9 nats-server and restart it", func() error {
		h.nats.Kill()
		time.Sleep(2 * time.Second)
		return h.startNATS()
	}}
	return slices.Concat(workerKills(4*time.Second), []fault{
		natsKill,
		{4 * time.Second, "stop versitygw for 10s", func() error {
			_ = h.gw.Stop(stopGrace)
			time.Sleep(10 * time.Second)
			return h.startGW()
		}},
		{3 * time.Second, "SIGSTOP worker 1 mid-upload past AckWait while another attempt commits, then SIGCONT", h.pauseMidUpload},
	}, workerKills(3*time.Second), []fault{natsKill})
}

// exhaust kills both workers each time the last jobs submitted run again, max_deliver times,
// and keeps every worker down past AckWait after the last: their last delivery times out
// while nobody is there to see it, and a worker that starts later must dead-letter them.
func (h *harness) exhaust(step func(string, func() error) error) error {
	ids := make([]string, exhaustJobs)
	stamp := time.Now().UTC().Format("150405")
	for i := range ids {
		ids[i] = fmt.Sprintf("faults-last-%s-%02d", stamp, i)
	}
	h.lastIDs = ids
	if err := h.submitWaves(ids, 0); err != nil {
		return err
	}
	for attempt := 1; attempt <= maxDeliver; attempt++ {
		// Wait for some of them to run attempt n; a short job may end first, which is fine.
		_ = poll(90*time.Second, fmt.Sprintf("the last jobs to run attempt %d", attempt), func() bool {
			st, err := h.statuses(ids...)
			if err != nil {
				return false
			}
			running := 0
			for _, id := range ids {
				if s := st[id]; s.State == job.StateRunning && s.Attempt >= attempt {
					running++
				}
			}
			return running >= 2
		})
		what := fmt.Sprintf("SIGKILL every worker during attempt %d of the last jobs", attempt)
		down := time.Second
		if attempt == maxDeliver {
			what += ", down past AckWait"
			down = 2*ackWait + 2*time.Second
		}
		if err := step(what, func() error {
			for _, w := range h.workers {
				w.Kill()
			}
			if attempt == maxDeliver {
				return h.downPastLastDelivery(ids, down)
			}
			time.Sleep(down)
			for _, w := range h.workers {
				if err := w.Start(context.Background()); err != nil {
					return err
				}
			}
			return nil
		}); err != nil {
			return err
		}
	}
	return nil
}

// downPastLastDelivery runs with every worker just killed: it notes the jobs whose last
// delivery died with them, keeps the workers down for down, past that delivery's ack
// deadline, and starts them again.
func (h *harness) downPastLastDelivery(ids []string, down time.Duration) error {
	st, err := h.statuses(ids...)
	if err != nil {
		return fmt.Errorf("read which jobs were on their last delivery: %w", err)
	}
	for _, id := range ids {
		if s := st[id]; s.State == job.StateRunning && s.Attempt == maxDeliver {
			h.lastDelivery = append(h.lastDelivery, id)
		}
	}
	if len(h.lastDelivery) == 0 {
		return errors.New("no job was on its last delivery when every worker was killed: the fault missed its aim")
	}
	fmt.Fprintf(os.Stderr, "faults: every worker down while the last delivery of %s times out\n", strings.Join(h.lastDelivery, ", "))
	time.Sleep(down)
	for _, w := range h.workers {
		if err := w.Start(context.Background()); err != nil {
			return err
		}
	}
	return nil
}

// pauseMidUpload stops worker 1 while it uploads a run's object (the proxy holds the upload),
// keeps it stopped past AckWait until another attempt has committed the job, and lets it go
// on: its attempt is stale, and what it writes must not change the committed run.
func (h *harness) pauseMidUpload() error {
	caught := h.proxy.arm()
	defer h.proxy.letGo()
	var up upload
	select {
	case up = <-caught:
	case <-time.After(2 * time.Minute):
		return errors.New("worker 1 began no upload in 2 minutes: the pause cannot be aimed")
	}
	w := h.workers[1]
	w.Signal(syscall.SIGSTOP)
	h.proxy.letGo() // the object is written; the answer waits for the stopped worker
	fmt.Fprintf(os.Stderr, "faults: worker 1 stopped while uploading %s\n", up)
	err := poll(3*time.Minute, "another attempt to commit "+up.jobID, func() bool {
		m, ok, err := h.manifest(up.jobID)
		if !ok || err != nil || m.Predicate.Attempt == up.attempt {
			return false
		}
		st, err := h.statuses(up.jobID)
		return err == nil && st[up.jobID].State.Terminal()
	})
	w.Signal(syscall.SIGCONT)
	h.paused = append(h.paused, up)
	return err
}

// manifest reads a job's committed manifest from versitygw's folder; ok is false when there
// is none.
func (h *harness) manifest(id string) (st provenance.Statement, ok bool, err error) {
	b, err := os.ReadFile(filepath.Join(h.runsDir(), id, "manifest.json"))
	if err != nil {
		return provenance.Statement{}, false, nil
	}
	st, err = provenance.Parse(b)
	return st, true, err
}

func (h *harness) runsDir() string {
	return filepath.Join(h.dir, "s3", bucket, "tenants", "default", "runs")
}

// logged reports whether worker i logged msg for the job's attempt.
func (h *harness) logged(i int, msg, jobID string, attempt int) bool {
	b, err := os.ReadFile(h.workers[i].Log)
	if err != nil {
		return false
	}
	for line := range strings.SplitSeq(string(b), "\n") {
		var rec struct {
			Msg     string `json:"msg"`
			JobID   string `json:"job_id"`
			Attempt int    `json:"attempt"`
		}
		if json.Unmarshal([]byte(line), &rec) == nil && rec.Msg == msg && rec.JobID == jobID && rec.Attempt == attempt {
			return true
		}
	}
	return false
}

// submitWaves submits ids with `submit run --jobs` in waves of submitWave, one every every.
func (h *harness) submitWaves(ids []string, every time.Duration) error {
	for w := 0; w*submitWave < len(ids); w++ {
		var lines strings.Builder
		for i := w * submitWave; i < min(len(ids), (w+1)*submitWave); i++ {
			fmt.Fprintf(&lines, `{"id":%q,"profile":"csv-analyst","task":"Summarise sales.csv (job %d)","inputs":["examples/sales.csv"]}`+"\n", ids[i], i)
		}
		file := filepath.Join(h.dir, "jobs-"+ids[w*submitWave]+".jsonl")
		if err := os.WriteFile(file, []byte(lines.String()), 0o600); err != nil {
			return err
		}
		// A wave sent across a NATS restart may not know its outcome; sending it again with
		// the same ids is what a script does: the job stream refuses a job still queued, and a
		// worker runs nothing for one that already ran.
		var out []byte
		err := poll(60*time.Second, "wave "+file+" to be submitted", func() bool {
			var err error
			out, err = h.submit("run", "--jobs", file)
			return err == nil
		})
		if err != nil {
			return fmt.Errorf("%w: %s", err, lastLines(out, 5))
		}
		time.Sleep(every)
	}
	return nil
}

// drain waits until every job's status is final.
func (h *harness) drain(ids []string) error {
	var left []string
	err := poll(drainWithin, "every job to end", func() bool {
		st, err := h.statuses()
		if err != nil {
			return false
		}
		left = left[:0]
		for _, id := range ids {
			if s, ok := st[id]; !ok || !s.State.Terminal() {
				left = append(left, id)
			}
		}
		return len(left) == 0
	})
	if err != nil {
		return fmt.Errorf("%w: %d jobs not final, e.g. %v", err, len(left), left[:min(5, len(left))])
	}
	return nil
}

func (h *harness) connect() (*nats.Conn, jetstream.JetStream, error) {
	nc, err := nats.Connect(h.natsURL, nats.Timeout(2*time.Second))
	if err != nil {
		return nil, nil, err
	}
	js, err := jetstream.New(nc)
	if err != nil {
		nc.Close()
		return nil, nil, err
	}
	return nc, js, nil
}

// tenantKey is a job's key in the status bucket: the runs submit as tenant default.
func tenantKey(id string) string { return "default." + id }

// statuses reads the status of ids, or of every job when none are given.
func (h *harness) statuses(ids ...string) (map[string]job.Status, error) {
	nc, js, err := h.connect()
	if err != nil {
		return nil, err
	}
	defer nc.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	kv, err := js.KeyValue(ctx, "BOXCAR_STATUS_default") // tenant default's status bucket
	if err != nil {
		return nil, err
	}
	if len(ids) == 0 {
		keys, err := kv.ListKeys(ctx)
		if err != nil {
			return nil, err
		}
		for k := range keys.Keys() {
			ids = append(ids, strings.TrimPrefix(k, tenantKey("")))
		}
	}
	out := map[string]job.Status{}
	for _, k := range ids {
		e, err := kv.Get(ctx, tenantKey(k))
		if err != nil {
			continue
		}
		var s job.Status
		if json.Unmarshal(e.Value(), &s) == nil {
			out[k] = s
		}
	}
	return out, nil
}

type result struct {
	committed, dead, lost, duplicates, orphans, redelivered, verifyFailed, stuck int
	// wrong counts broken invariants the line does not Name: a status that names another
	// attempt or worker than the manifest, a stale attempt's object in a committed run, a
	// fault that missed its aim.
	wrong int
}

// check reads the final state: consumer, status bucket, dead-letter stream, store, processes.
func (h *harness) check(ids []string) (result, error) {
	var r result
	st, err := h.statuses()
	if err != nil {
		return r, fmt.Errorf("read the status bucket: %w", err)
	}
	nc, js, err := h.connect()
	if err != nil {
		return r, err
	}
	defer nc.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	cons, err := js.Consumer(ctx, "BOXCAR_JOBS_default", "boxcar-workers-default")
	if err != nil {
		return r, fmt.Errorf("read the consumer: %w", err)
	}
	ci, err := cons.Info(ctx)
	if err != nil {
		return r, fmt.Errorf("read the consumer: %w", err)
	}
	if ci.NumPending+uint64(ci.NumAckPending) > 0 {
		r.stuck = int(ci.NumPending) + ci.NumAckPending
		fmt.Fprintf(os.Stderr, "faults: consumer: %d pending, %d waiting for an ack after the drain\n", ci.NumPending, ci.NumAckPending)
	}

	// Tenant default's dead letters, and those a worker wrote into the shared stream.
	letters := map[string]uint64{}
	for _, name := range []string{"BOXCAR_DLQ_default", "BOXCAR_DLQ"} {
		dlq, err := js.Stream(ctx, name)
		if err != nil {
			return r, fmt.Errorf("read the dead-letter stream %s: %w", name, err)
		}
		di, err := dlq.Info(ctx, jetstream.WithSubjectFilter(">"))
		if err != nil {
			return r, fmt.Errorf("read the dead-letter stream %s: %w", name, err)
		}
		maps.Copy(letters, di.State.Subjects)
	}

	for _, id := range ids {
		// A dead job's manifest records the death (the manifest key is the one arbiter a
		// commit and a death both race for), so only a manifest of another outcome commits.
		m, manifest, merr := h.manifest(id)
		outcome := m.Predicate.Outcome.State
		if merr != nil {
			r.wrong++
			fmt.Fprintf(os.Stderr, "faults: MANIFEST %s: %v\n", id, merr)
		}
		deadManifest := manifest && outcome == job.StateDead
		manifest = manifest && !deadManifest
		dead := int(letters["BOXCAR_DLQ_default."+id] + letters["BOXCAR_DLQ.default."+id])
		s := st[id]
		if s.Attempt > 1 {
			r.redelivered++
		}
		if deadManifest && dead == 0 {
			fmt.Fprintf(os.Stderr, "faults: LOST %s: a dead manifest and no dead letter; status %s\n", id, s.State)
		}
		switch {
		case manifest && dead > 0 && outcome != job.StateFailed: // a failed run keeps its letter
			r.duplicates++
			fmt.Fprintf(os.Stderr, "faults: DUPLICATE %s: a manifest and %d dead letter(s); status %s attempt %d worker %s: %s\n", id, dead, s.State, s.Attempt, s.Worker, s.Error)
			h.showJobLines(id)
		case dead > 1:
			r.duplicates++
			fmt.Fprintf(os.Stderr, "faults: DUPLICATE %s: %d dead letters; status %s\n", id, dead, s.State)
		case !manifest && dead == 0:
			r.lost++
			fmt.Fprintf(os.Stderr, "faults: LOST %s: no manifest, no dead letter; status %s attempt %d worker %s: %s\n", id, s.State, s.Attempt, s.Worker, s.Error)
			h.showJobLines(id)
		case manifest:
			r.committed++
			if out, err := h.submit("verify", "--allow-unsigned", id); err != nil {
				r.verifyFailed++
				fmt.Fprintf(os.Stderr, "faults: VERIFY %s: %v: %s\n", id, err, lastLines(out, 5))
			}
			if s.State != job.StateSucceeded && s.State != job.StateCapped && s.State != job.StateFailed {
				fmt.Fprintf(os.Stderr, "faults: STATUS %s: committed but status says %s\n", id, s.State)
				r.lost++
			}
		default:
			r.dead++
			if s.State != job.StateDead && s.State != job.StateRejected {
				fmt.Fprintf(os.Stderr, "faults: STATUS %s: dead-lettered but status says %s\n", id, s.State)
				r.lost++
			}
		}
		// The status is derived from what is committed: it names the manifest's outcome,
		// attempt and worker, whichever delivery ended the job.
		if manifest && merr == nil && (s.State != outcome || s.Attempt != m.Predicate.Attempt || s.Worker != m.Predicate.Worker.ID) {
			r.wrong++
			fmt.Fprintf(os.Stderr, "faults: STATUS %s: status says %s, attempt %d by %q; the manifest %s, attempt %d by %q\n",
				id, s.State, s.Attempt, s.Worker, outcome, m.Predicate.Attempt, m.Predicate.Worker.ID)
		}
	}
	if h.cluster == nil { // the aimed faults are those of the single-server schedule
		r.wrong += h.checkAims()
	}
	r.orphans = h.orphans()
	return r, nil
}

// checkAims checks that the aimed faults happened as aimed and left the end the README
// promises; it returns how many did not.
func (h *harness) checkAims() int {
	wrong := 0
	fail := func(format string, args ...any) {
		wrong++
		fmt.Fprintf(os.Stderr, "faults: "+format+"\n", args...)
	}
	// A job whose last delivery died with every worker is ended by the next worker to start:
	// an exhausted delivery (beyond max_deliver) records it dead. One that committed just
	// before the kill ends as committed instead; at least one must have died.
	exhausted := 0
	for _, id := range h.lastDelivery {
		if m, ok, err := h.manifest(id); ok && err == nil && m.Predicate.Attempt > maxDeliver && m.Predicate.Outcome.State == job.StateDead {
			exhausted++
		}
	}
	if exhausted == 0 {
		fail("AIM no job whose last delivery died with every worker was ended by a later delivery: %v", h.lastDelivery)
	}
	for _, up := range h.paused {
		m, ok, err := h.manifest(up.jobID)
		if !ok || err != nil {
			fail("PAUSE %s: no readable committed manifest: %v", up, err)
			continue
		}
		if m.Predicate.Attempt == up.attempt {
			fail("PAUSE %s: the paused attempt's run was committed", up)
		}
		for _, sub := range m.Subjects {
			if strings.Contains(provenance.SubjectKey(up.jobID, sub), "/attempts/"+up.folder+"/") {
				fail("PAUSE %s: the committed run names %s of the paused attempt", up, sub.Name)
			}
		}
		if out, err := h.submit("verify", "--allow-unsigned", up.jobID); err != nil {
			fail("PAUSE %s: submit verify: %v: %s", up, err, lastLines(out, 5))
		}
		if !h.logged(1, "another attempt took this job over; discarding this attempt's result", up.jobID, up.attempt) {
			fail("PAUSE %s: worker 1 never resumed the paused attempt to be refused", up)
		}
		left, _ := filepath.Glob(filepath.Join(h.runsDir(), up.jobID, "attempts", up.folder, "*"))
		fmt.Fprintf(os.Stderr, "faults: paused attempt %s resumed and was refused; committed attempt %d by %s; %d of its objects left\n",
			up, m.Predicate.Attempt, m.Predicate.Worker.ID, len(left))
	}
	return wrong
}

// orphans counts bwrap processes still running in this run's sandbox root after every
// worker stopped.
func (h *harness) orphans() int {
	n := 0
	procs, _ := filepath.Glob("/proc/[0-9]*/cmdline")
	for _, p := range procs {
		b, err := os.ReadFile(p)
		if err != nil || !strings.Contains(string(b), h.sandboxRoot()) {
			continue
		}
		if strings.HasSuffix(strings.SplitN(string(b), "\x00", 2)[0], "bwrap") {
			n++
			fmt.Fprintf(os.Stderr, "faults: ORPHAN %s: %q\n", filepath.Dir(p), strings.ReplaceAll(string(b), "\x00", " ")[:min(200, len(b))])
		}
	}
	return n
}

// stopGrace is how long a process has to end after SIGTERM before it is killed.
const stopGrace = 20 * time.Second

// poll waits up to within (times the test timeout scale) for ok: harness.Poll, for the fault
// run's conditions, which have no error to tell.
func poll(within time.Duration, what string, ok func() bool) error {
	return testharness.Poll(context.Background(), within, what, func(context.Context) (bool, error) { return ok(), nil })
}

// listeningAddr waits for p to listen and returns the address, read from /proc.
func listeningAddr(p *testharness.Process) (string, error) {
	var addr string
	var err error
	werr := poll(30*time.Second, p.Name+" to listen", func() bool {
		addr, err = testnet.ListeningAddr(p.Pid())
		return addr != "" || err != nil
	})
	if err != nil {
		return "", err
	}
	return addr, werr
}

// lookBin finds a server binary on PATH or in GOPATH/bin, where `go install` puts it.
func lookBin(name string) (string, error) {
	if p, err := exec.LookPath(name); err == nil {
		return p, nil
	}
	out, err := exec.Command("go", "env", "GOPATH").Output()
	if err == nil {
		p := filepath.Join(strings.Split(strings.TrimSpace(string(out)), ":")[0], "bin", name)
		if _, err := os.Stat(p); err == nil {
			return p, nil
		}
	}
	return "", errors.New(name + " not found on PATH or in GOPATH/bin; run  make test-faults, which installs it")
}

// showJobLines prints the workers' last log lines that name id, so that a CI run, whose
// temporary folder is gone with its machine, shows how a lost or duplicated job went.
func (h *harness) showJobLines(id string) {
	for _, w := range h.workers {
		b, err := os.ReadFile(w.Log)
		if err != nil {
			continue
		}
		var mine []string
		for line := range strings.Lines(string(b)) {
			if strings.Contains(line, id) {
				mine = append(mine, strings.TrimRight(line, "\n"))
			}
		}
		fmt.Fprintf(os.Stderr, "faults: %s's lines naming %s (the last 40 of %d):\n%s\n", w.Name, id, len(mine), strings.Join(mine[max(0, len(mine)-40):], "\n"))
	}
}

func lastLines(b []byte, n int) string {
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}
