package agent_test

import (
	"context"
	"net/http"
	"strings"
	"testing"

	"github.com/boxcar-run/boxcar/internal/agent"
	"github.com/boxcar-run/boxcar/test/harness"
)

// TestChatFollowsNoRedirectOffItsOrigin: a chat request the endpoint redirects to another
// origin (here the same 127.0.0.1 on another port, where Go's client would resend the
// Authorization header) is not sent there: the OpenAI client refuses any request off the base
// URL's origin, and the run fails without the key in its error.
func TestChatFollowsNoRedirectOffItsOrigin(t *testing.T) {
	for _, status := range []int{http.StatusFound, http.StatusTemporaryRedirect, http.StatusPermanentRedirect} {
		endpoint, other := harness.RedirectingOrigins(t, status, "Authorization")
		s := newScript(t)
		a := newAgent(t, s, func(c *agent.Config) { c.BaseURL, c.HTTPClient = endpoint.URL+"/v1", endpoint.Client() })
		_, err := a.Run(context.Background(), request(csvProfile(t), newFakeSandbox(nil)))
		if got := other.Take(); len(got) > 0 {
			t.Errorf("%d: the redirect was followed: the other origin got %s", status, strings.Join(got, "; "))
		}
		if err == nil || strings.Contains(err.Error(), testKey) {
			t.Errorf("%d: Run: %v; want an error without the key", status, err)
		}
	}
}
