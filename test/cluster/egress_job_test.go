package cluster_test

import (
	"bytes"
	"crypto/rand"
	"crypto/tls"
	"encoding/hex"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/boxcar-run/boxcar/internal/demomodel"
	"github.com/boxcar-run/boxcar/internal/queue"
	"github.com/boxcar-run/boxcar/internal/queue/queuetest"
	"github.com/boxcar-run/boxcar/internal/testnet"
	"github.com/boxcar-run/boxcar/test/testcert"
)

// apiHost is the name the networked job's token is bound to; the test's resolver answers it
// with the address of its network namespace.
const apiHost = "api.boxcar.test"

// TestEgressJob runs a whole job of a profile with a network and a secret on the cluster, as
// TestJobEndToEnd does (the worker's Run, the Kubernetes backend, the demo model, submit): the
// worker's own proxy serves the pod's tunnel, from the release image's binary. The job's
// statistics tool first sends the token's placeholder to the API (which must see the real
// value: TLS terminated for its bound host), and prints the pod's environment and every
// /proc/*/environ to its stderr (which the transcript keeps). Then the transcript, the report,
// the manifest, the worker's log and its /metrics hold 0 bytes of the token.
func TestEgressJob(t *testing.T) {
	ns := sandboxNamespace(t)
	release, _ := importReleaseImage(t)
	importToolsImage(t)
	dir := t.TempDir()
	var b [16]byte
	_, _ = rand.Read(b[:])
	secret := "realtoken" + hex.EncodeToString(b[:])

	netns := testnet.NewNetns(t)
	api := &seenAuth{}
	caPath := serveAPI(t, netns, api, filepath.Join(dir, "upstream-ca.pem"))
	resolver := serveDNS(t, apiHost, netns.Addr)

	nats := queuetest.Start(t, queue.EmbeddedOptions{StoreDir: filepath.Join(dir, "nats")})
	model := httptest.NewServer(demomodel.Handler())
	t.Cleanup(model.Close)

	tmpl := readFile(t, "testdata/egress-worker.yaml.tmpl")
	cfg := strings.NewReplacer("{{KUBECONFIG}}", kube.Kubeconfig, "{{NAMESPACE}}", ns, "{{IMAGE}}", toolsImage,
		"{{BRIDGE_IMAGE}}", release, "{{RESOLVER}}", resolver, "{{UPSTREAM_CA}}", caPath,
		"{{ALLOWED_CIDR}}", netns.Addr.String()+"/32", "{{API_HOST}}", apiHost).Replace(tmpl)
	cfgPath := filepath.Join(dir, "worker.yaml")
	if err := os.WriteFile(cfgPath, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	storeDir := filepath.Join(dir, "store")
	env := map[string]string{
		"NATS_URL": nats.ClientURL(), "BOXCAR_STORE": "file://" + storeDir,
		"OPENAI_BASE_URL": model.URL + "/v1", "OPENAI_API_KEY": "sk-cluster-secret-never-logged",
		"BOXCAR_TEST_API_TOKEN": secret,
	}
	metricsAddr, workerLog := startWorker(t, cfgPath, env)

	_, stmt := runSalesJob(t, env, storeDir)
	if got := api.all(); len(got) != 1 || got[0] != "Bearer "+secret {
		t.Errorf("the API saw %d requests, the first with the real token: %v; want one, with it", len(got), len(got) == 1 && got[0] == "Bearer "+secret)
	}
	eg := stmt.Predicate.Egress
	if eg == nil || len(eg.Hosts) != 1 || eg.Hosts[0].Host != apiHost || len(eg.SecretsUsed) != 1 || eg.SecretsUsed[0] != "API_TOKEN" {
		t.Errorf("manifest egress %+v; want requests to %s using API_TOKEN", eg, apiHost)
	}
	if iso := stmt.Predicate.Sandbox.Isolation; !strings.Contains(iso, "tunnelled over pods/exec") {
		t.Errorf("manifest isolation %q does not name the tunnel", iso)
	}
	transcript, err := os.ReadFile(runFile(t, storeDir, stmt, "transcript.jsonl"))
	if err != nil {
		t.Fatal(err)
	}
	// The scan is worth something only if the pod's environment reached the transcript.
	for _, want := range []string{"API_TOKEN=", "HTTPS_PROXY=http://127.0.0.1:3128", `"type":"egress"`} {
		if !bytes.Contains(transcript, []byte(want)) {
			t.Errorf("the transcript lacks %q: the environment dump or the decisions did not reach it", want)
		}
	}
	report, err := os.ReadFile(runFile(t, storeDir, stmt, "report.md"))
	if err != nil {
		t.Fatal(err)
	}
	manifest, err := os.ReadFile(filepath.Join(storeDir, "tenants", "default", "runs", stmt.Predicate.Job.ID, "manifest.json"))
	if err != nil {
		t.Fatal(err)
	}
	_, metrics := httpGet(t, "http://"+metricsAddr+"/metrics")
	if !strings.Contains(metrics, "boxcar_egress_") {
		t.Error("/metrics has no boxcar_egress_ series: the scan would see nothing")
	}
	for name, data := range map[string][]byte{
		"transcript": transcript, "report": report, "manifest": manifest,
		"worker log": []byte(workerLog.String()), "/metrics": []byte(metrics),
	} {
		if n := bytes.Count(data, []byte(secret)); n != 0 {
			t.Errorf("the %s holds the real token %d times", name, n)
		}
	}
	noSandboxLeft(t, ns)
}

// seenAuth records the Authorization header of each request, server side only.
type seenAuth struct {
	mu   sync.Mutex
	auth []string
}

func (s *seenAuth) all() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.auth...)
}

// serveAPI serves HTTPS for apiHost on port 443 of the namespace, with a certificate of its
// own root, written at caPath for the worker's egress.upstream_ca.
func serveAPI(t testing.TB, netns *testnet.Netns, seen *seenAuth, caPath string) string {
	t.Helper()
	cert, caPEM := testcert.SelfSigned(t, apiHost)
	if err := os.WriteFile(caPath, caPEM, 0o600); err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{
		Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			seen.mu.Lock()
			seen.auth = append(seen.auth, r.Header.Get("Authorization"))
			seen.mu.Unlock()
			_, _ = w.Write([]byte("api answered\n"))
		}),
		TLSConfig:         &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12},
		ReadHeaderTimeout: 10 * time.Second,
	}
	ln := netns.Listen(t, "tcp", 443).(net.Listener)
	go func() { _ = srv.ServeTLS(ln, "", "") }()
	t.Cleanup(func() { srv.Close() })
	return caPath
}

// serveDNS answers A queries for name with addr, and every other query with no answer, on a
// UDP port of the host's loopback; it returns the address, for the worker's egress.resolver.
func serveDNS(t *testing.T, name string, addr netip.Addr) string {
	t.Helper()
	return testnet.ServeDNS(t, func(asked string) []netip.Addr {
		if asked != strings.ToLower(name) {
			return nil
		}
		return []netip.Addr{addr}
	})
}
