package cluster_test

import (
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/boxcar-run/boxcar/internal/demomodel"
	"github.com/boxcar-run/boxcar/internal/queue"
	"github.com/boxcar-run/boxcar/internal/queue/queuetest"
	"github.com/boxcar-run/boxcar/test/cluster"
	"github.com/boxcar-run/boxcar/test/harness"
	"github.com/boxcar-run/boxcar/test/testworker"
)

// TestJobEndToEnd runs one whole Boxcar job on the cluster: the worker through its Run
// function with the Kubernetes backend, NATS embedded in this process, the file store, the
// scripted demo model, and the job submitted through the submit command's Run.
func TestJobEndToEnd(t *testing.T) {
	ns := sandboxNamespace(t)
	dir := t.TempDir()

	nats := queuetest.Start(t, queue.EmbeddedOptions{StoreDir: filepath.Join(dir, "nats")})
	model := httptest.NewServer(demomodel.Handler())
	t.Cleanup(model.Close)

	tmpl, err := os.ReadFile("testdata/worker.yaml.tmpl")
	if err != nil {
		t.Fatal(err)
	}
	cfgPath := filepath.Join(dir, "worker.yaml")
	cfg := strings.NewReplacer("{{KUBECONFIG}}", kube.Kubeconfig, "{{NAMESPACE}}", ns, "{{IMAGE}}", cluster.SandboxImage).Replace(string(tmpl))
	if err := os.WriteFile(cfgPath, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	storeURL := "file://" + filepath.Join(dir, "store")
	env := map[string]string{
		"NATS_URL": nats.ClientURL(), "BOXCAR_STORE": storeURL,
		"OPENAI_BASE_URL": model.URL + "/v1", "OPENAI_API_KEY": "sk-cluster-secret-never-logged",
	}
	metricsAddr, _ := startWorker(t, cfgPath, env)

	t.Run("ready", func(t *testing.T) {
		// /readyz includes the backend's Check: the worker may list pods and create pods and
		// pods/exec in its namespace on the real API server.
		code, body := httpGet(t, "http://"+metricsAddr+"/readyz")
		if code != http.StatusOK {
			t.Fatalf("/readyz = %d %q, want 200", code, body)
		}
	})

	_, stmt := runSalesJob(t, env, filepath.Join(dir, "store"))
	sb := stmt.Predicate.Sandbox
	if sb.Backend != "kubernetes" || sb.Image != cluster.SandboxImage || !strings.HasPrefix(sb.ID, "boxcar-") {
		t.Errorf("manifest sandbox = %+v, want backend kubernetes, image %s and the pod's name", sb, cluster.SandboxImage)
	}
	if !strings.HasPrefix(sb.ImageDigest, "sha256:") {
		t.Errorf("manifest image digest = %q, want the image id containerd reported", sb.ImageDigest)
	}

	noSandboxLeft(t, ns)
}

// startWorker runs the worker command in-process on cfgPath with env until the test ends,
// waits until it takes jobs, and returns the address of its metrics endpoint and its log.
func startWorker(t *testing.T, cfgPath string, env map[string]string) (string, *harness.LogBuffer) {
	t.Helper()
	w := testworker.Start(t, testworker.Config{ConfigFile: cfgPath, Model: env["OPENAI_BASE_URL"], Env: env})
	t.Cleanup(func() {
		w.Stop(t) // first, so that the whole log is checked
		if strings.Contains(w.Log.String(), "sk-cluster-secret") {
			t.Error("worker log contains the API key")
		}
	})
	return w.Addrs().Metrics, w.Log
}

func httpGet(t *testing.T, url string) (int, string) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(body)
}
