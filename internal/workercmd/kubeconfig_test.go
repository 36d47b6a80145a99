package workercmd

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
)

// TestKubeConfigFollowsNoRedirect: the clients the worker makes from its kubeconfig refuse an
// API server's redirect to another origin. The worker's own client (pods, the informer, the
// reaper) followed one with the cluster's token; the sandbox's exec client already refused.
func TestKubeConfigFollowsNoRedirect(t *testing.T) {
	t.Parallel()
	const token = "the-clusters-token"
	var reached atomic.Int32
	other := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		reached.Add(1)
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`{"kind":"Pod","apiVersion":"v1","metadata":{"name":"p"}}`))
	}))
	defer other.Close()
	api := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, other.URL+r.URL.RequestURI(), http.StatusTemporaryRedirect)
	}))
	defer api.Close()
	path := filepath.Join(t.TempDir(), "kubeconfig")
	kubeconfig := fmt.Sprintf(`apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: %q}}]
users: [{name: u, user: {token: %q}}]
contexts: [{name: x, context: {cluster: c, user: u}}]
current-context: x
`, api.URL, token)
	if err := os.WriteFile(path, []byte(kubeconfig), 0o600); err != nil {
		t.Fatal(err)
	}

	cfg, err := kubeConfig(path)
	if err != nil {
		t.Fatal(err)
	}
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	_, err = client.CoreV1().Pods("ns").Get(t.Context(), "p", metav1.GetOptions{})
	if n := reached.Load(); n > 0 {
		t.Fatalf("the redirect was followed to %s (%d requests, each with the cluster's token)", other.URL, n)
	}
	if err == nil || !strings.Contains(err.Error(), "redirect") || strings.Contains(err.Error(), token) {
		t.Fatalf("Get through a redirect: %v, want the redirect refused, the token unnamed", err)
	}
}
