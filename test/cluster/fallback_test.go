package cluster_test

import (
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/boxcar-run/boxcar/internal/sandbox"
	"github.com/boxcar-run/boxcar/internal/sandbox/sandboxtest"
	"github.com/boxcar-run/boxcar/test/cluster"
)

// TestSPDYFallback puts a proxy in front of the API server that refuses WebSocket upgrades, as
// API servers before 1.30 and some proxies do. The backend must fall back to SPDY, and run each
// command once: a fallback after a WebSocket run that had started would run it twice.
func TestSPDYFallback(t *testing.T) {
	ns := sandboxNamespace(t)
	target, err := url.Parse(kube.APIServer)
	if err != nil {
		t.Fatal(err)
	}
	// HTTP/1.1 only: a connection upgrade cannot pass through HTTP/2.
	tlsConfig, err := rest.TLSConfigFor(kube.RESTConfig)
	if err != nil {
		t.Fatal(err)
	}
	tlsConfig.NextProtos = []string{"http/1.1"}
	transport := &http.Transport{TLSClientConfig: tlsConfig}
	var mu sync.Mutex
	upgrades := map[string]int{}
	rp := httputil.NewSingleHostReverseProxy(target)
	rp.Transport = transport
	proxy := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if up := strings.ToLower(r.Header.Get("Upgrade")); up != "" {
			mu.Lock()
			upgrades[up]++
			mu.Unlock()
			if up == "websocket" {
				http.Error(w, "this proxy does not upgrade to websocket", http.StatusBadRequest)
				return
			}
		}
		rp.ServeHTTP(w, r)
	}))
	t.Cleanup(proxy.Close)

	// Through the proxy, which holds the credentials: the client talks plain HTTP on 127.0.0.1.
	rc := &rest.Config{Host: proxy.URL, QPS: 50, Burst: 100}
	client, err := kubernetes.NewForConfig(rc)
	if err != nil {
		t.Fatal(err)
	}
	p, err := sandbox.NewKubernetes(sandbox.KubernetesConfig{
		Client: client, RESTConfig: rc, Namespace: ns, Image: cluster.SandboxImage,
		ImagePullPolicy: corev1.PullNever, WorkerID: "fallback", StartTimeout: 2 * time.Minute,
	})
	if err != nil {
		t.Fatal(err)
	}
	sb := sandboxtest.Start(t, p)
	res := sandboxtest.Exec(t, sb, sandbox.ExecRequest{
		Argv: []string{"sh", "-c", "echo run >> runs; cat; echo err >&2; exit 3"}, Stdin: []byte("in\n"), Timeout: 30 * time.Second,
	})
	if res.ExitCode != 3 || string(res.Stdout) != "in\n" || string(res.Stderr) != "err\n" {
		t.Errorf("exec over SPDY: exit %d, stdout %q, stderr %q; want 3, \"in\\n\", \"err\\n\"", res.ExitCode, res.Stdout, res.Stderr)
	}
	runs, err := sb.ReadFile(t.Context(), "runs", 100)
	if err != nil {
		t.Fatal(err)
	}
	if string(runs) != "run\n" {
		t.Errorf("the command ran %d times, want once", strings.Count(string(runs), "run"))
	}
	mu.Lock()
	defer mu.Unlock()
	if upgrades["websocket"] == 0 || upgrades["spdy/3.1"] == 0 {
		t.Errorf("upgrades asked = %v, want websocket refused, then spdy/3.1", upgrades)
	}
}
