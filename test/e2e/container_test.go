//go:build integration

package e2e

// Container tests, through testcontainers-go against a local Docker engine (scripts/docker.sh):
// the worker's release image as the chart runs it, and a store that goes away under a running
// worker. Every container runs on the host network (or none), with a read-only root and no
// capabilities; images are built here from local files, never pulled.

import (
	"bytes"
	"context"
	"debug/buildinfo"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/testcontainers/testcontainers-go"

	"github.com/boxcar-run/boxcar/examples"
	"github.com/boxcar-run/boxcar/internal/config"
	"github.com/boxcar-run/boxcar/internal/demomodel"
	"github.com/boxcar-run/boxcar/internal/job"
	"github.com/boxcar-run/boxcar/internal/queue"
	"github.com/boxcar-run/boxcar/internal/queue/queuetest"
	"github.com/boxcar-run/boxcar/internal/store/s3test"
	"github.com/boxcar-run/boxcar/internal/submitcmd"
	"github.com/boxcar-run/boxcar/internal/testnet"
	"github.com/boxcar-run/boxcar/test/containers"
	"github.com/boxcar-run/boxcar/test/harness"
	"github.com/boxcar-run/boxcar/test/testworker"
)

// Where the chart mounts the worker's config; the container tests mount theirs there too.
const (
	chartConfigPath     = "/etc/boxcar/config/boxcar.yaml"
	containerKubeconfig = "/etc/boxcar/kube/config"
	imageUser           = "65532:65532"
	workerDrainGrace    = 5 * time.Second
)

// TestReleaseImage takes the worker's release image `make image` built from the repository's
// Dockerfile and runs it the way the Helm chart does: the config mounted at
// /etc/boxcar/config, host networking, a read-only root, no capabilities, uid 65532.
func TestReleaseImage(t *testing.T) {
	t.Parallel()
	p := containers.NewDocker(t)
	image, version := containers.ReleaseImage(t, p)

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	info, err := p.Client().ImageInspect(ctx, image)
	if err != nil {
		t.Fatalf("inspect %s: %v", image, err)
	}
	t.Logf("image %s: %.1f MB", image, float64(info.Size)/1e6)
	if got := info.Config.User; got != imageUser {
		t.Errorf("image user = %q, want %q (the chart's runAsUser and runAsGroup)", got, imageUser)
	}
	if got, want := info.Config.Entrypoint, []string{"/usr/local/bin/worker"}; !slices.Equal(got, want) {
		t.Errorf("image entrypoint = %q, want %q (the chart passes only flags)", got, want)
	}
	if got := info.Config.Labels["org.opencontainers.image.version"]; got != version {
		t.Errorf("image version label = %q, want %q", got, version)
	}

	t.Run("binary", func(t *testing.T) {
		// `worker --help` runs in the image and exits 0.
		c := containers.Run(t, p, containers.Spec{Image: image, Cmd: []string{"--help"}})
		st := containers.WaitExit(t, c, 30*time.Second)
		logs := containers.Logs(t, c)
		if st.ExitCode != 0 || !strings.Contains(logs, "usage: worker [flags]") {
			t.Errorf("worker --help: exit %d, output:\n%s\nwant exit 0 and the usage", st.ExitCode, logs)
		}
		// `worker version` names the release the image was built as: the manifests it
		// writes carry the same version.
		vc := containers.Run(t, p, containers.Spec{Image: image, Cmd: []string{"version"}})
		if st := containers.WaitExit(t, vc, 30*time.Second); st.ExitCode != 0 {
			t.Errorf("worker version: exit %d", st.ExitCode)
		}
		if logs := containers.Logs(t, vc); !strings.HasPrefix(logs, "worker "+version+" ") {
			t.Errorf("worker version printed %q, want it to start with %q", logs, "worker "+version+" ")
		}
		// The binary must be the static, trimmed build.
		bin := copyFromContainer(t, c, "/usr/local/bin/worker")
		if err := checkStatic(bin); err != nil {
			t.Error(err)
		}
		bi, err := buildinfo.ReadFile(bin)
		if err != nil {
			t.Fatalf("build info of the image's worker: %v", err)
		}
		settings := map[string]string{}
		for _, s := range bi.Settings {
			settings[s.Key] = s.Value
		}
		if settings["CGO_ENABLED"] != "0" || settings["-trimpath"] != "true" {
			t.Errorf("worker built with CGO_ENABLED=%q -trimpath=%q, want 0 and true", settings["CGO_ENABLED"], settings["-trimpath"])
		}
		t.Logf("image's worker: %s %s, %s, vcs.revision %q", bi.Path, bi.Main.Version, bi.GoVersion, settings["vcs.revision"])
		if bi.Path != "github.com/boxcar-run/boxcar/cmd/worker" {
			t.Errorf("image's worker is %s", bi.Path)
		}

		hostCA, err := os.ReadFile("/etc/ssl/certs/ca-certificates.crt")
		if err != nil {
			t.Fatal(err)
		}
		for _, f := range []struct {
			path string
			want func([]byte) bool
			what string
		}{
			{"/etc/ssl/certs/ca-certificates.crt", func(b []byte) bool { return bytes.Equal(b, hostCA) }, "the host's CA bundle"},
			{"/etc/passwd", func(b []byte) bool { return bytes.Contains(b, []byte("\nboxcar:x:65532:65532:")) }, "user boxcar with uid and gid 65532"},
			{"/etc/group", func(b []byte) bool { return bytes.Contains(b, []byte("\nboxcar:x:65532:")) }, "group boxcar with gid 65532"},
		} {
			data, err := os.ReadFile(copyFromContainer(t, c, f.path))
			if err != nil {
				t.Fatal(err)
			}
			if !f.want(data) {
				t.Errorf("image's %s is not %s:\n%.300s", f.path, f.what, data)
			}
		}
	})

	ns := startNATS(t)
	s3 := s3test.Start(t)
	bucket := s3.CreateBucket(t)
	deadAPI := testnet.ClosedAddr(t)   // the Kubernetes API server that is not there
	deadModel := testnet.ClosedAddr(t) // no model is ever reached: jobs never get a sandbox
	env := map[string]string{
		"AWS_ACCESS_KEY_ID":     s3.AccessKey,
		"AWS_SECRET_ACCESS_KEY": s3.SecretKey,
		"AWS_REGION":            s3test.Region,
		"OPENAI_API_KEY":        testworker.APIKey,
	}
	// The worker binds port 0 for its endpoints and logs the address it got.
	workerConfig := func(t *testing.T, kubeconfig string) string {
		path := filepath.Join(t.TempDir(), "boxcar.yaml")
		writeText(t, path, fmt.Sprintf(`concurrency: 1
metrics_addr: 127.0.0.1:0
drain_grace: %s
nats:
  url: %s
  retry_backoff: 1s
store:
  url: s3://%s
  endpoint: %s
  region: %s
  path_style: true
sandbox:
  backend: kubernetes
  kubernetes: {namespace: boxcar-sandboxes, kubeconfig: %q}
model:
  base_url: http://%s/v1
profiles:
  file-summary:
    model: {name: gpt-4.1-mini}
    system_prompt: Summarise the input files.
    sandbox: {image: busybox:1.37}
    tools:
      - name: list_files
`, workerDrainGrace, ns.ClientURL(), bucket, s3.Endpoint, s3test.Region, kubeconfig, deadModel))
		return path
	}
	submitEnv := harness.Env(s3.Vars()).With("NATS_URL", ns.ClientURL(), "BOXCAR_STORE", "s3://"+bucket, "BOXCAR_S3_ENDPOINT", s3.Endpoint)

	t.Run("no cluster", func(t *testing.T) {
		// Kubernetes sandboxes, and neither an in-cluster service account nor a kubeconfig:
		// the worker stops at start with the fix, before it serves anything.
		c := containers.Run(t, p, containers.Spec{
			Image: image, Env: env,
			Cmd:   []string{"--config=" + chartConfigPath, "--log-level=info"},
			Binds: []string{workerConfig(t, "") + ":" + chartConfigPath + ":ro"},
		})
		st := containers.WaitExit(t, c, 60*time.Second)
		logs := containers.Logs(t, c)
		want := "worker: kubernetes: not in a cluster (unable to load in-cluster configuration, KUBERNETES_SERVICE_HOST and KUBERNETES_SERVICE_PORT must be defined); set sandbox.kubernetes.kubeconfig"
		if st.ExitCode != 1 || lastLine(logs) != want {
			t.Errorf("worker without a cluster: exit %d, last line %q\nwant exit 1 and %q\nlog:\n%s", st.ExitCode, lastLine(logs), want, logs)
		}
		assertNoSecrets(t, "worker log", logs, s3.SecretKey, testworker.APIKey)
	})

	t.Run("cluster unreachable", func(t *testing.T) {
		kubeconfig := filepath.Join(t.TempDir(), "kubeconfig")
		writeText(t, kubeconfig, fmt.Sprintf(`apiVersion: v1
kind: Config
clusters: [{name: gone, cluster: {server: "https://%s"}}]
users: [{name: gone, user: {}}]
contexts: [{name: gone, context: {cluster: gone, user: gone}}]
current-context: gone
`, deadAPI))
		started := time.Now()
		readyDir := writableDir(t)
		c := containers.Run(t, p, containers.Spec{
			Image: image, Env: env,
			Cmd: []string{"--config=" + chartConfigPath, "--log-level=info", "--ready-file=/run/boxcar/ready.json"},
			Binds: []string{
				workerConfig(t, containerKubeconfig) + ":" + chartConfigPath + ":ro",
				kubeconfig + ":" + containerKubeconfig + ":ro",
				readyDir + ":/run/boxcar",
			},
		})
		// Its NATS and store answer, so it takes jobs (the poison one below) while /readyz
		// says it cannot start a sandbox; the ready file has its addresses.
		base := "http://" + readyAddrs(t, filepath.Join(readyDir, "ready.json"), stillRunning(c)).Metrics
		waitHTTP(t, base+"/healthz", http.StatusOK, 60*time.Second, stillRunning(c))
		t.Logf("worker container answered /healthz %s after start", time.Since(started).Round(time.Millisecond))

		// The process runs as 65532, without capabilities, unable to gain privileges.
		inspect, err := c.Inspect(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		status := procStatus(t, inspect.State.Pid)
		for key, want := range map[string]string{
			"Uid": "65532\t65532\t65532\t65532", "Gid": "65532\t65532\t65532\t65532",
			"CapEff": "0000000000000000", "CapPrm": "0000000000000000", "CapBnd": "0000000000000000",
			"NoNewPrivs": "1",
		} {
			if status[key] != want {
				t.Errorf("worker process %s = %q, want %q", key, status[key], want)
			}
		}
		if !inspect.HostConfig.ReadonlyRootfs || inspect.HostConfig.NetworkMode != "host" {
			t.Errorf("container: read-only root %v, network %q; want true, host", inspect.HostConfig.ReadonlyRootfs, inspect.HostConfig.NetworkMode)
		}

		// /readyz says the sandbox backend is unusable, and why: the API server does not answer.
		wantReady := regexp.MustCompile(`^not ready: sandbox kubernetes: .*\(the API server does not answer\).*https://` + regexp.QuoteMeta(deadAPI) + `/.*: connect: connection refused\n$`)
		// The worker checks its dependencies one by one after start, so poll for the reason.
		waitReadyz(t, base+"/readyz", wantReady, 60*time.Second, stillRunning(c))

		// A poison job is fetched although no sandbox could start: it needs none. It is
		// rejected and dead-lettered with its reason.
		poison := publishUnchecked(t, ns.ClientURL(), "no-such-profile")
		dl := waitDeadLetter(t, ns.ClientURL(), poison, 30*time.Second)
		if dl.Reason != "unknown_profile" || !strings.Contains(dl.Error, `unknown profile "no-such-profile"`) || dl.Attempt != 1 {
			t.Errorf("dead letter = reason %q, error %q, attempt %d; want unknown_profile, the profile named, attempt 1", dl.Reason, dl.Error, dl.Attempt)
		}
		if st := jobStatus(t, submitEnv, poison); st["state"] != "rejected" || !strings.Contains(fmt.Sprint(st["error"]), `unknown profile "no-such-profile"`) {
			t.Errorf("status of the poison job = %v, want rejected with the profile named", st)
		}

		// A good job cannot get a sandbox: it waits for the cluster with its first delivery
		// kept, instead of spending its deliveries on the outage, and its status says it waits
		// for the backend, in fixed words: neither where the API server is nor what it said (the
		// worker's log says that).
		out, err := submitWith(t, submitEnv, "run", "--profile", "file-summary", "--task", "x", "--output", "json")
		if err != nil {
			t.Fatalf("submit: %v\n%s", err, out)
		}
		good := lastJSON(t, out)["id"].(string)
		wantErr := regexp.MustCompile(`^waiting for the sandbox backend: it does not answer`)
		st := waitStatus(t, submitEnv, good, 30*time.Second, func(st map[string]any) bool { return wantErr.MatchString(fmt.Sprint(st["error"])) })
		if st["state"] != "running" || fmt.Sprint(st["attempt"]) != "1" || strings.Contains(fmt.Sprint(st), deadAPI) {
			t.Errorf("status of a job without a sandbox = %v\nwant running at attempt 1, without the API server's address", st)
		}

		// docker stop sends SIGTERM: the worker drains and exits 0 within its grace.
		stopStart := time.Now()
		timeout := 30 * time.Second
		if err := c.Stop(context.Background(), &timeout); err != nil {
			t.Fatal(err)
		}
		stopped := time.Since(stopStart)
		final := containers.WaitExit(t, c, 10*time.Second)
		logs := containers.Logs(t, c)
		t.Logf("docker stop took %s", stopped.Round(time.Millisecond))
		if final.ExitCode != 0 || final.OOMKilled || stopped > workerDrainGrace+5*time.Second {
			t.Errorf("after docker stop: exit %d (OOM killed %v) after %s; want exit 0 within the drain grace (%s)\n%s", final.ExitCode, final.OOMKilled, stopped, workerDrainGrace, logs)
		}
		if !strings.Contains(logs, "worker: stopping: finishing running jobs") || !strings.Contains(logs, `"msg":"worker stopped"`) {
			t.Errorf("the worker's log does not show a drain on SIGTERM:\n%s", logs)
		}
		if !strings.Contains(logs, deadAPI) {
			t.Errorf("the worker's log does not say which API server did not answer (%s):\n%s", deadAPI, logs)
		}
		assertNoSecrets(t, "worker log", logs, s3.SecretKey, testworker.APIKey)
	})
}

// TestStoreOutageWithContainers runs the S3 store (versitygw, static, in a FROM scratch image
// built here) in a container on the host network and takes it away under a worker that runs
// in-process with bubblewrap sandboxes.
func TestStoreOutageWithContainers(t *testing.T) {
	t.Parallel()
	p := containers.NewDocker(t)
	gw := staticVersitygw(t)
	dir := t.TempDir()
	copyInto(t, gw, filepath.Join(dir, "versitygw"))
	writeText(t, filepath.Join(dir, "Dockerfile"), "FROM scratch\nCOPY versitygw /versitygw\nUSER 65532:65532\nENTRYPOINT [\"/versitygw\"]\n")
	image := containers.BuildImage(t, p, dir, "boxcar-e2e-versitygw", nil)

	t.Run("stopped during a job", func(t *testing.T) {
		began := time.Now()
		st := startStoreContainer(t, p, image)
		model := newGatedModel(t)
		w := startS3Worker(t, st, model.url)

		input := filepath.Join(t.TempDir(), "sales.csv")
		writeText(t, input, string(examples.SalesCSV))
		out, err := submitWith(t, w.Submit, "run", "--profile", "csv-analyst", "--task", "Summarise sales.csv", "--input", input, "--output", "json")
		if err != nil {
			t.Fatalf("submit: %v\n%s", err, out)
		}
		id := lastJSON(t, out)["id"].(string)

		// Every status the job goes through, as `submit watch` sees them.
		history := watchStatus(t, w.NATSURL, id)

		// The job holds its sandbox and waits for the model: take the store away now.
		select {
		case <-model.asked:
		case <-time.After(60 * time.Second):
			t.Fatalf("the job never reached the model\n%s", w.Log.String())
		}
		st.stop(t)
		close(model.release)

		// The attempt has done its work: its upload waits for the store instead of throwing the
		// work away, and the status says what it waits for, but not where the store listens nor
		// what it said (the worker's log has that).
		wantErr := regexp.MustCompile(`^waiting for the store: it does not answer`)
		waiting := history.waitFor(t, 60*time.Second, func(s job.Status) bool {
			return strings.HasPrefix(s.Error, "waiting for the store")
		})
		if waiting.State != job.StateRunning || waiting.Attempt != 1 || !wantErr.MatchString(waiting.Error) || strings.Contains(waiting.Error, st.addr) {
			t.Errorf("status after the store went away = %+v\nwant running, attempt 1, error matching %s", waiting, wantErr)
		}
		t.Logf("attempt 1, store stopped: %s: %s", waiting.State, waiting.Error)
		if dl, ok := deadLetter(t, w.NATSURL, id); ok {
			t.Errorf("a transient store fault dead-lettered the job: %+v", dl)
		}

		st.start(t)
		done := waitStatus(t, w.Submit, id, 90*time.Second, func(s map[string]any) bool {
			state, _ := s["state"].(string)
			return state != "retrying" && state != "running" && state != "queued"
		})
		// The delivery was kept through the outage: the first attempt commits, none is spent.
		if done["state"] != "succeeded" || done["attempt"].(float64) != 1 {
			t.Fatalf("after the store came back: %v, want succeeded on attempt 1\n%s", done, w.Log.String())
		}
		t.Logf("store back: %s on attempt %v", done["state"], done["attempt"])
		// Exactly once: one committed run, one success in the log, no dead letter.
		runDir := filepath.Join(st.dataDir, st.bucket, "tenants", "default", "runs", id)
		manifests, _ := filepath.Glob(filepath.Join(runDir, "manifest*.json"))
		if len(manifests) != 1 {
			t.Errorf("run folder holds manifests %v, want exactly manifest.json", manifests)
		}
		var stmt struct {
			Predicate struct {
				Attempt int `json:"attempt"`
				Outcome struct {
					State string `json:"state"`
				} `json:"outcome"`
			} `json:"predicate"`
		}
		data, err := os.ReadFile(filepath.Join(runDir, "manifest.json"))
		if err != nil {
			t.Fatal(err)
		}
		if err := json.Unmarshal(data, &stmt); err != nil {
			t.Fatal(err)
		}
		if stmt.Predicate.Attempt != int(done["attempt"].(float64)) || stmt.Predicate.Outcome.State != "succeeded" {
			t.Errorf("manifest: attempt %d, outcome %q; want attempt %v, succeeded", stmt.Predicate.Attempt, stmt.Predicate.Outcome.State, done["attempt"])
		}
		if n := strings.Count(w.Log.String(), `"job_id":"`+id+`"`); n == 0 {
			t.Errorf("worker log never names job %s", id)
		}
		// The status is written before the settle's log line: wait for that line.
		harness.Wait(t, "the worker logs the settle of job "+id, func() (bool, error) {
			return countSucceeded(w.Log.String(), id) > 0, errors.New("no settle line")
		}, harness.Within(30*time.Second))
		if n := countSucceeded(w.Log.String(), id); n != 1 {
			t.Errorf("worker log shows %d successful settles of job %s, want 1\n%s", n, id, w.Log.String())
		}
		if _, ok := deadLetter(t, w.NATSURL, id); ok {
			t.Errorf("job %s has a dead letter although it succeeded", id)
		}
		if out, err := submitWith(t, w.Submit, "get", id, "--out", t.TempDir()); err != nil {
			t.Errorf("submit get after the outage: %v\n%s", err, out)
		}
		assertNoSecrets(t, "worker log", w.Log.String(), st.secretKey, testworker.APIKey)
		t.Logf("store outage during a job: %s in all", time.Since(began).Round(time.Millisecond))
	})

	t.Run("dead from the start", func(t *testing.T) {
		began := time.Now()
		st := startStoreContainer(t, p, image)
		st.stop(t)
		w := launchStoreWorker(t, st, demoModel(t))

		// The worker waits for the store rather than take jobs it cannot run; /readyz says why.
		waitReadyz(t, w.MetricsURL(t)+"/readyz", regexp.MustCompile(`^not ready: store: store: prove create-only puts on s3://`+st.bucket+`/\.boxcar/create-only-probe\.txt: .*dial tcp `+regexp.QuoteMeta(st.addr)+`: connect: connection refused`), 30*time.Second, w.Alive)

		// A job (no inputs: submit cannot upload any) waits in the queue, not in a worker, and
		// spends none of its deliveries.
		out, err := submitWith(t, w.Submit, "run", "--profile", "csv-analyst", "--task", "Summarise", "--output", "json")
		if err != nil {
			t.Fatalf("submit: %v\n%s", err, out)
		}
		id := lastJSON(t, out)["id"].(string)
		if s := jobStatus(t, w.Submit, id); s["state"] != "queued" {
			t.Errorf("status of a job submitted while the store is down = %v, want queued", s)
		}
		w.notReady(t, "without its store")

		st.start(t)
		waitHTTP(t, w.MetricsURL(t)+"/readyz", http.StatusOK, 60*time.Second, w.Alive)
		done := waitStatus(t, w.Submit, id, 90*time.Second, func(s map[string]any) bool {
			state, _ := s["state"].(string)
			return state != "retrying" && state != "running" && state != "queued"
		})
		if done["state"] != "succeeded" || done["attempt"] != float64(1) {
			t.Errorf("after the store came back: %v, want succeeded on attempt 1", done)
		}
		if n := strings.Count(w.Log.String(), `"msg":"waiting for store`); n != 1 {
			t.Errorf("worker logged the wait for the store %d times, want once", n)
		}
		if dl, ok := deadLetter(t, w.NATSURL, id); ok {
			t.Errorf("a job that only waited for the store was dead-lettered: %+v", dl)
		}
		t.Logf("store dead from the start: %s in all", time.Since(began).Round(time.Millisecond))
	})
}

// storeContainer is versitygw in a container on the host network, with its data in a host
// folder that outlives stops.
type storeContainer struct {
	c         *testcontainers.DockerContainer
	addr      string // 127.0.0.1:port
	endpoint  string
	dataDir   string
	bucket    string
	accessKey string
	secretKey string
}

func startStoreContainer(t *testing.T, p *testcontainers.DockerProvider, image string) *storeContainer {
	t.Helper()
	s := &storeContainer{dataDir: t.TempDir(), bucket: "boxcar-" + containers.RandomHex(6), accessKey: "boxcar-test-" + containers.RandomHex(4), secretKey: containers.RandomHex(20)}
	// The container runs as 65532 and writes the posix backend's folders (a bucket is a folder).
	for _, d := range []string{s.dataDir, filepath.Join(s.dataDir, s.bucket)} {
		if err := os.MkdirAll(d, 0o777); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(d, 0o777); err != nil {
			t.Fatal(err)
		}
	}
	s.addr = restartableAddr(t)
	s.endpoint = "http://" + s.addr
	// As root the store runs as the image's 65532; otherwise as the caller, who must be able to
	// remove what it wrote when the test's folders are cleaned up.
	user := ""
	if os.Getuid() != 0 {
		user = fmt.Sprintf("%d:%d", os.Getuid(), os.Getgid())
	}
	s.c = containers.Run(t, p, containers.Spec{
		Image: image,
		User:  user,
		// Credentials through the environment: not in the command line, a log or a layer.
		Env:   map[string]string{"ROOT_ACCESS_KEY_ID": s.accessKey, "ROOT_SECRET_ACCESS_KEY": s.secretKey},
		Cmd:   []string{"--port", s.addr, "--region", s3test.Region, "--health", "/health", "--keep-alive", "--quiet", "posix", "/data"},
		Binds: []string{s.dataDir + ":/data"},
	})
	waitHTTP(t, s.endpoint+"/health", http.StatusOK, 30*time.Second, stillRunning(s.c))
	return s
}

// restartableAddr is a loopback address for the store container, which must come back on the
// same port after `docker stop` and `docker start` as an operator's store does (the worker's
// config names it, and its errors while the store is down name it too). docker start reuses
// the command line, so port 0 would move the store; this is the one port the tests pick.
func restartableAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// stop is `docker stop`: versitygw gets SIGTERM and its port closes.
func (s *storeContainer) stop(t *testing.T) {
	t.Helper()
	timeout := 10 * time.Second
	if err := s.c.Stop(context.Background(), &timeout); err != nil {
		t.Fatalf("stop the store: %v", err)
	}
}

// start is `docker start` of the stopped container: same port, same data.
func (s *storeContainer) start(t *testing.T) {
	t.Helper()
	if err := s.c.Start(context.Background()); err != nil {
		t.Fatalf("start the store again: %v\n%s", err, containers.Logs(t, s.c))
	}
	waitHTTP(t, s.endpoint+"/health", http.StatusOK, 30*time.Second, stillRunning(s.c))
}

// startS3Worker runs the worker with the example csv-analyst profile, bubblewrap sandboxes,
// its own NATS and the store container, until the test ends, and waits until it is ready.
func startS3Worker(t *testing.T, st *storeContainer, modelURL string) *worker {
	t.Helper()
	w := launchStoreWorker(t, st, modelURL)
	w.WaitReady(t)
	return w
}

// launchStoreWorker is startS3Worker without the wait. Retries come quickly, so the test sees
// the second attempt soon after the store returns.
func launchStoreWorker(t *testing.T, st *storeContainer, modelURL string) *worker {
	t.Helper()
	ns := startNATS(t)
	w := launchWorker(t, testworker.Config{NATS: ns.ClientURL(), NATSYAML: "retry_backoff: 1s\nmax_deliver: 20",
		Store: "s3://" + st.bucket, StoreYAML: fmt.Sprintf("endpoint: %s\nregion: %s\npath_style: true", st.endpoint, s3test.Region),
		Model: modelURL, Env: st.vars()})
	w.Submit = w.Submit.With("BOXCAR_S3_ENDPOINT", st.endpoint)
	return w
}

// vars are the AWS SDK's settings for the store container (s3test.Server.Vars).
func (s *storeContainer) vars() harness.Env {
	return harness.Env{"AWS_ACCESS_KEY_ID": s.accessKey, "AWS_SECRET_ACCESS_KEY": s.secretKey, "AWS_REGION": s3test.Region,
		"AWS_EC2_METADATA_DISABLED": "true"}
}

// gatedModel is the demo model holding its first answer until release is closed: the job sits
// in its sandbox, before any upload, for as long as the test needs.
type gatedModel struct {
	url     string
	asked   chan struct{} // closed at the first request
	release chan struct{}
}

func newGatedModel(t *testing.T) *gatedModel {
	t.Helper()
	m := &gatedModel{asked: make(chan struct{}), release: make(chan struct{})}
	var once sync.Once
	demo := demomodel.Handler()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		once.Do(func() { close(m.asked) })
		select {
		case <-m.release:
		case <-r.Context().Done():
			return
		}
		demo.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	t.Cleanup(func() {
		select {
		case <-m.release:
		default:
			close(m.release)
		}
	})
	m.url = srv.URL + "/v1"
	return m
}

// statusHistory records every status a job goes through.
type statusHistory struct {
	mu   sync.Mutex
	seen []job.Status
}

// watchStatus follows the job's status in the status bucket from now until it ends or the test
// does.
func watchStatus(t *testing.T, natsURL, id string) *statusHistory {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	nc, err := queue.Connect(ctx, queue.ConnOptions{URL: natsURL, Name: "boxcar-e2e-watch"})
	if err != nil {
		t.Fatal(err)
	}
	q, err := queue.NewClient(ctx, nc, config.Config{}.WithDefaults().NATS, "default")
	if err != nil {
		t.Fatal(err)
	}
	updates, err := q.WatchStatus(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	h := &statusHistory{}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for st := range updates {
			h.mu.Lock()
			h.seen = append(h.seen, st)
			h.mu.Unlock()
		}
	}()
	t.Cleanup(func() { cancel(); <-done; nc.Close() })
	return h
}

// waitFor returns the first recorded status for which ok holds, waiting for it up to within.
func (h *statusHistory) waitFor(t *testing.T, within time.Duration, ok func(job.Status) bool) job.Status {
	t.Helper()
	var found job.Status
	harness.Wait(t, "the job reaches the status wanted", func() (bool, error) {
		h.mu.Lock()
		seen := slices.Clone(h.seen)
		h.mu.Unlock()
		for _, st := range seen {
			if ok(st) {
				found = st
				return true, nil
			}
		}
		return false, fmt.Errorf("seen %+v", seen)
	}, harness.Within(within))
	return found
}

// startNATS runs the real nats-server in-process on a free loopback port.
func startNATS(t *testing.T) *server.Server {
	t.Helper()
	return queuetest.Start(t, queue.EmbeddedOptions{Host: "127.0.0.1"})
}

// jobStatus is `submit status ID --output json`.
func jobStatus(t *testing.T, env map[string]string, id string) map[string]any {
	t.Helper()
	out, err := submitWith(t, env, "status", id, "--output", "json")
	if err != nil {
		t.Fatalf("submit status %s: %v\n%s", id, err, out)
	}
	return lastJSON(t, out)
}

// waitStatus polls `submit status` until ok holds, and returns that status.
func waitStatus(t *testing.T, env map[string]string, id string, within time.Duration, ok func(map[string]any) bool) map[string]any {
	t.Helper()
	var last map[string]any
	harness.Wait(t, "job "+id+" reaches the status wanted", func() (bool, error) {
		var stdout, stderr bytes.Buffer
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		err := submitcmd.Run(ctx, []string{"status", id, "--output", "json"}, harness.Env(env).Getenv, &stdout, &stderr)
		cancel()
		if err != nil {
			return false, fmt.Errorf("status %v (submit status: %v %s)", last, err, stderr.String())
		}
		last = lastJSON(t, stdout.String())
		return ok(last), fmt.Errorf("status %v", last)
	}, harness.Within(within))
	return last
}

// deadLetter reads the job's dead letter, in tenant default's dead-letter stream or the shared
// one, if there is one.
func deadLetter(t *testing.T, natsURL, id string) (queue.DeadLetter, bool) {
	t.Helper()
	nc, err := nats.Connect(natsURL)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	data, err := queue.DeadLetterOf(ctx, nc, config.Config{}.WithDefaults().NATS, queue.Ref{Tenant: "default", ID: id})
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return queue.DeadLetter{}, false
	}
	if err != nil {
		t.Fatalf("read dead letter of %s: %v", id, err)
	}
	var dl queue.DeadLetter
	if err := json.Unmarshal(data, &dl); err != nil {
		t.Fatalf("decode dead letter of %s: %v", id, err)
	}
	return dl, true
}

func waitDeadLetter(t *testing.T, natsURL, id string, within time.Duration) queue.DeadLetter {
	t.Helper()
	var dl queue.DeadLetter
	harness.Wait(t, "a dead letter for job "+id, func() (bool, error) {
		var ok bool
		dl, ok = deadLetter(t, natsURL, id)
		return ok, errors.New("none in the dead-letter streams")
	}, harness.Within(within))
	return dl
}

// countSucceeded counts the worker's log lines that settle job id as succeeded.
func countSucceeded(log, id string) int {
	n := 0
	for _, line := range strings.Split(log, "\n") {
		if strings.Contains(line, `"job_id":"`+id+`"`) && strings.Contains(line, `"state":"succeeded"`) {
			n++
		}
	}
	return n
}

// copyFromContainer copies one file out of a container (running or not) into a temp folder.
func copyFromContainer(t *testing.T, c *testcontainers.DockerContainer, path string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	rc, err := c.CopyFileFromContainer(ctx, path)
	if err != nil {
		t.Fatalf("copy %s out of the container: %v", path, err)
	}
	defer rc.Close()
	data, err := io.ReadAll(rc)
	if err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(t.TempDir(), filepath.Base(path))
	if err := os.WriteFile(out, data, 0o755); err != nil {
		t.Fatal(err)
	}
	return out
}

// procStatus reads /proc/<pid>/status of a container's process, as the host sees it.
func procStatus(t *testing.T, pid int) map[string]string {
	t.Helper()
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatalf("read the worker process's status: %v", err)
	}
	fields := map[string]string{}
	for _, line := range strings.Split(string(data), "\n") {
		if k, v, ok := strings.Cut(line, ":"); ok {
			fields[k] = strings.TrimSpace(v)
		}
	}
	return fields
}

func lastLine(s string) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	return lines[len(lines)-1]
}

func assertNoSecrets(t *testing.T, what, text string, secrets ...string) {
	t.Helper()
	for _, s := range secrets {
		if s != "" && strings.Contains(text, s) {
			t.Errorf("%s contains a secret (%d characters starting %q)", what, len(s), s[:4])
		}
	}
}

// publishUnchecked puts a job for profile on the default tenant's subject as it is, past
// submit's check that a live worker defines the profile: what a client other than submit may
// send, which the worker must reject itself. It returns the job's id.
func publishUnchecked(t *testing.T, natsURL, profile string) string {
	t.Helper()
	nc, err := queue.Connect(t.Context(), queue.ConnOptions{URL: natsURL, Name: "boxcar-e2e-raw"})
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	q, err := queue.NewClient(t.Context(), nc, config.Config{}.WithDefaults().NATS, "default")
	if err != nil {
		t.Fatal(err)
	}
	j := job.Job{Version: job.Version, ID: job.NewID(), Profile: profile, Task: "x", SubmittedAt: time.Now().UTC()}
	if _, err := q.Publish(t.Context(), j); err != nil {
		t.Fatal(err)
	}
	return j.ID
}
