package cluster_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"

	"github.com/boxcar-run/boxcar/internal/demomodel"
	"github.com/boxcar-run/boxcar/internal/queue"
	"github.com/boxcar-run/boxcar/internal/queue/queuetest"
	"github.com/boxcar-run/boxcar/test/cluster"
	"github.com/boxcar-run/boxcar/test/containers"
	"github.com/boxcar-run/boxcar/test/harness"
)

// Where the chart mounts the worker's config and where this test mounts the kubeconfig and the
// store; the image's user, which is the chart's runAsUser and runAsGroup.
const (
	imageConfigPath     = "/etc/boxcar/config/boxcar.yaml"
	imageKubeconfigPath = "/etc/boxcar/kube/config"
	imageStorePath      = "/var/lib/boxcar/store"
	imageUID            = 65532
	imageUser           = "65532:65532"
)

// TestReleaseImageRunsAJobOnTheCluster takes the worker's release image `make image` built from the
// repository's Dockerfile, runs it the way the chart does (host network, read-only
// root, no capabilities, uid 65532, config mounted read-only), and has it run one job in a
// sandbox pod of the test cluster: NATS embedded in this process, a file store in a host
// folder mounted into the container, the scripted demo model, the job submitted through the
// submit command's Run.
func TestReleaseImageRunsAJobOnTheCluster(t *testing.T) {
	started := time.Now()
	p := containers.NewDocker(t)
	image, version := containers.ReleaseImage(t, p)

	// `worker version` in the image names the release it was built as.
	vc := containers.Run(t, p, containers.Spec{Image: image, Cmd: []string{"version"}, User: imageUser})
	if st := containers.WaitExit(t, vc, 30*time.Second); st.ExitCode != 0 || !strings.HasPrefix(containers.Logs(t, vc), "worker "+version+" ") {
		t.Fatalf("worker version: exit %d, output %q; want exit 0 and %q first", st.ExitCode, containers.Logs(t, vc), "worker "+version+" ")
	}

	ns := sandboxNamespace(t)
	dir := t.TempDir()
	nats := queuetest.Start(t, queue.EmbeddedOptions{Host: "127.0.0.1", StoreDir: filepath.Join(dir, "nats")})

	// The marker secret goes to the container as OPENAI_API_KEY; the model sees it as the
	// bearer token (so it did reach the worker), and nothing the worker writes may hold it.
	const secret = "sk-image-marker-secret-never-written"
	var sawKey atomic.Bool
	demo := demomodel.Handler()
	model := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") == "Bearer "+secret {
			sawKey.Store(true)
		}
		demo.ServeHTTP(w, r)
	}))
	t.Cleanup(model.Close)

	// The worker's files, readable by uid 65532 only. The kubeconfig is the cluster's admin one
	// with its certificates inlined, since their host paths are not in the container.
	kubeconfig := filepath.Join(dir, "kubeconfig")
	kcfg, err := clientcmd.LoadFromFile(kube.Kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	if err := clientcmdapi.FlattenConfig(kcfg); err != nil {
		t.Fatalf("inline the kubeconfig's certificates: %v", err)
	}
	if err := clientcmd.WriteToFile(*kcfg, kubeconfig); err != nil {
		t.Fatal(err)
	}
	tmpl, err := os.ReadFile("testdata/worker.yaml.tmpl")
	if err != nil {
		t.Fatal(err)
	}
	workerConfig := filepath.Join(dir, "boxcar.yaml")
	cfg := "drain_grace: 10s\n" + strings.NewReplacer("{{KUBECONFIG}}", imageKubeconfigPath,
		"{{NAMESPACE}}", ns, "{{IMAGE}}", cluster.SandboxImage).Replace(string(tmpl))
	if err := os.WriteFile(workerConfig, []byte(cfg), 0o400); err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{kubeconfig, workerConfig} {
		if err := os.Chmod(f, 0o400); err != nil {
			t.Fatal(err)
		}
		if err := os.Chown(f, imageUID, imageUID); err != nil {
			t.Fatal(err)
		}
	}
	// The store folder belongs to 65532 and is setgid, as a volume with the chart's fsGroup:
	// what submit writes there as root (the inputs) gets group 65532, which the worker reads.
	storeDir := imageUserDir(t, filepath.Join(dir, "store"), 0o770|os.ModeSetgid)
	// The worker says it takes jobs with its ready file, in a folder it can write.
	readyDir := imageUserDir(t, filepath.Join(dir, "ready"), 0o700)
	c := containers.Run(t, p, containers.Spec{
		Image: image, User: imageUser,
		Cmd: []string{"--config=" + imageConfigPath, "--metrics-addr=127.0.0.1:0", "--log-level=info", "--ready-file=/run/boxcar/ready.json"},
		Env: map[string]string{
			"NATS_URL": nats.ClientURL(), "BOXCAR_STORE": "file://" + imageStorePath,
			"OPENAI_BASE_URL": model.URL + "/v1", "OPENAI_API_KEY": secret,
		},
		Binds: []string{
			workerConfig + ":" + imageConfigPath + ":ro",
			kubeconfig + ":" + imageKubeconfigPath + ":ro",
			storeDir + ":" + imageStorePath,
			readyDir + ":/run/boxcar",
		},
	})
	stopped := false
	t.Cleanup(func() {
		if t.Failed() && !stopped {
			t.Logf("worker container log:\n%s", containers.Logs(t, c))
		}
	})

	// Ready: its ready file says so, and /readyz (which includes the backend's check against
	// the real API server) answers 200 before any job is submitted.
	addrs, err := harness.WaitReadyFile(t.Context(), harness.DefaultTimeout, "the worker container", filepath.Join(readyDir, "ready.json"), func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if st, err := c.State(ctx); err == nil && !st.Running {
			return fmt.Errorf("worker container exited with %d before it was ready:\n%s", st.ExitCode, containers.Logs(t, c))
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	metricsAddr := addrs.Metrics
	if code, body := httpGet(t, "http://"+metricsAddr+"/readyz"); code != http.StatusOK {
		t.Fatalf("/readyz = %d %q, want 200", code, body)
	}
	t.Logf("worker container ready after %s", time.Since(started).Round(time.Millisecond))

	submitEnv := map[string]string{"NATS_URL": nats.ClientURL(), "BOXCAR_STORE": "file://" + storeDir}
	run, stmt := runSalesJob(t, submitEnv, storeDir)
	manifest := readFile(t, filepath.Join(run, "manifest.json"))
	if sb := stmt.Predicate.Sandbox; sb.Backend != "kubernetes" || sb.Image != cluster.SandboxImage || !strings.HasPrefix(sb.ImageDigest, "sha256:") {
		t.Errorf("manifest sandbox = %+v, want backend kubernetes, image %s and its digest", sb, cluster.SandboxImage)
	}
	if w := stmt.Predicate.Worker; w.Version != version {
		t.Errorf("manifest worker.version = %q, want %q, the version the image was built with", w.Version, version)
	}
	if !sawKey.Load() {
		t.Error("the model never saw the OPENAI_API_KEY given to the container")
	}
	transcript := readFile(t, runFile(t, storeDir, stmt, "transcript.jsonl"))
	noSandboxLeft(t, ns)

	// docker stop sends SIGTERM: the idle worker drains and exits 0.
	timeout := 30 * time.Second
	if err := c.Stop(context.Background(), &timeout); err != nil {
		t.Fatalf("docker stop: %v", err)
	}
	stopped = true
	final := containers.WaitExit(t, c, 10*time.Second)
	logs := containers.Logs(t, c)
	if final.ExitCode != 0 || final.OOMKilled || !strings.Contains(logs, `"msg":"worker stopped"`) {
		t.Errorf("after docker stop: exit %d (OOM killed %v); want exit 0 after the worker stopped\n%s", final.ExitCode, final.OOMKilled, logs)
	}
	for what, text := range map[string]string{"container log": logs, "manifest": manifest, "transcript": transcript} {
		for i, line := range strings.Split(text, "\n") {
			if strings.Contains(line, secret) {
				t.Errorf("%s line %d contains the OPENAI_API_KEY marker", what, i+1)
			}
		}
	}
	t.Logf("worker ready, job run and container stopped in %s", time.Since(started).Round(time.Millisecond))
}

func readFile(t *testing.T, path string) string {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(data)
}

// imageUserDir makes the folder path, owned by the image's user, with mode.
func imageUserDir(t *testing.T, path string, mode os.FileMode) string {
	t.Helper()
	if err := os.Mkdir(path, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(path, imageUID, imageUID); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(path, mode); err != nil {
		t.Fatal(err)
	}
	return path
}
