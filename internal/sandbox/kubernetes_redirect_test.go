package sandbox_test

import (
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	"github.com/boxcar-run/boxcar/internal/sandbox"
)

// TestKubernetesClientFollowsNoRedirect: an answer of the API server's that redirects (307) to
// another origin, on another port of the same host or on another host, is not followed by the
// client the worker builds from its rest.Config: followed, the next request carried the
// cluster's bearer token to that origin, since client-go's bearer round-tripper adds it to
// every request it sends, the redirected one too, whatever net/http strips on a redirect.
func TestKubernetesClientFollowsNoRedirect(t *testing.T) {
	t.Parallel()
	const token = "the-clusters-token"
	for _, tc := range []struct{ name, host string }{
		{"same host, another port", "127.0.0.1"},
		{"another host", "127.0.0.2"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			var mu sync.Mutex
			var seen []string // what reached the other origin: its Authorization headers
			other := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				mu.Lock()
				seen = append(seen, r.Header.Get("Authorization"))
				mu.Unlock()
				w.Header().Set("Content-Type", "application/json")
				_, _ = w.Write([]byte(`{"kind":"Pod","apiVersion":"v1","metadata":{"name":"p"}}`))
			}))
			ln, err := net.Listen("tcp", net.JoinHostPort(tc.host, "0"))
			if err != nil {
				t.Fatal(err)
			}
			other.Listener = ln
			other.Start()
			defer other.Close()
			api := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				http.Redirect(w, r, other.URL+r.URL.RequestURI(), http.StatusTemporaryRedirect)
			}))
			defer api.Close()

			client, err := kubernetes.NewForConfig(sandbox.RefuseRedirects(&rest.Config{Host: api.URL, BearerToken: token}))
			if err != nil {
				t.Fatal(err)
			}
			_, err = client.CoreV1().Pods("ns").Get(t.Context(), "p", metav1.GetOptions{})
			mu.Lock()
			defer mu.Unlock()
			if len(seen) > 0 {
				t.Fatalf("the redirect was followed to %s, with Authorization of %d bytes (the token's: %v)", other.URL, len(seen[0]), seen[0] == "Bearer "+token)
			}
			if err == nil || !strings.Contains(err.Error(), "redirect") || strings.Contains(err.Error(), token) {
				t.Fatalf("Get through a redirect: %v, want the redirect refused, the token unnamed", err)
			}
		})
	}
}
