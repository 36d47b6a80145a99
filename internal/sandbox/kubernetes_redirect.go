package sandbox

import (
	"fmt"
	"net/http"

	"k8s.io/client-go/rest"
)

// RefuseRedirects returns a copy of c whose clients follow no redirect of the API server's.
// client-go's clients follow one as net/http does, and its bearer round-tripper adds the
// cluster's token to every request it sends, the redirected one too, to whatever origin the
// answer named: net/http's stripping of Authorization on a redirect to another host is undone
// (TestKubernetesClientFollowsNoRedirect). The API server redirects nothing the worker asks;
// an answer that does is refused before the next request leaves, and the caller gets an error.
func RefuseRedirects(c *rest.Config) *rest.Config {
	c = rest.CopyConfig(c)
	// Wrap puts this below the credentials' round-trippers, next to the connection: the
	// request it refuses already carries the token and goes nowhere.
	c.Wrap(func(rt http.RoundTripper) http.RoundTripper { return noRedirects{rt} })
	return c
}

// noRedirects refuses the requests net/http makes to follow a redirect (those with Response
// set: the answer that redirected).
type noRedirects struct{ next http.RoundTripper }

func (n noRedirects) RoundTrip(req *http.Request) (*http.Response, error) {
	if req.Response != nil {
		if req.Body != nil {
			_ = req.Body.Close()
		}
		return nil, fmt.Errorf("sandbox: kubernetes: the API server answered %s %s with a redirect (%d) to %s, which the worker does not follow: its token would go along; point the worker at the API server itself (sandbox.kubernetes.kubeconfig)",
			req.Response.Request.Method, req.Response.Request.URL.Path, req.Response.StatusCode, req.URL.Host)
	}
	return n.next.RoundTrip(req)
}
