package agent_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/boxcar-run/boxcar/internal/agent"
)

// TestChatFollowsNoRedirectOffItsOrigin: a chat request the endpoint redirects to another
// origin (here the same 127.0.0.1 on another port, where Go's client would resend the
// Authorization header) is not sent there: the OpenAI client refuses any request off the base
// URL's origin, and the run fails without the key in its error.
func TestChatFollowsNoRedirectOffItsOrigin(t *testing.T) {
	var mu sync.Mutex
	var seen []string
	other := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		seen = append(seen, r.Method+" "+r.URL.Path+" Authorization="+r.Header.Get("Authorization"))
		mu.Unlock()
		http.Error(w, "no", http.StatusNotFound)
	}))
	t.Cleanup(other.Close)
	for _, status := range []int{http.StatusFound, http.StatusTemporaryRedirect, http.StatusPermanentRedirect} {
		endpoint := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			http.Redirect(w, r, other.URL+r.URL.Path, status)
		}))
		s := newScript(t)
		a := newAgent(t, s, func(c *agent.Config) { c.BaseURL, c.HTTPClient = endpoint.URL+"/v1", endpoint.Client() })
		_, err := a.Run(context.Background(), request(csvProfile(t), newFakeSandbox(nil)))
		endpoint.Close()
		mu.Lock()
		got := seen
		seen = nil
		mu.Unlock()
		if len(got) > 0 {
			t.Errorf("%d: the redirect was followed: the other origin got %s", status, strings.Join(got, "; "))
		}
		if err == nil || strings.Contains(err.Error(), testKey) {
			t.Errorf("%d: Run: %v; want an error without the key", status, err)
		}
	}
}
