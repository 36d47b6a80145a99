package workercmd

import (
	"context"
	"crypto/tls"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/boxcar-run/boxcar/internal/redact"
	"github.com/boxcar-run/boxcar/test/harness"
)

// origin is a loopback server, on TLS when tls is set, that records each request's
// Authorization.
type origin struct {
	*harness.Recorder
	addr string
}

func newOrigin(t *testing.T, tls bool, h http.HandlerFunc) origin {
	rec := &harness.Recorder{Fields: []string{"Authorization"}, Handler: h}
	srv := httptest.NewUnstartedServer(rec)
	if tls {
		srv.StartTLS()
	} else {
		srv.Start()
	}
	t.Cleanup(srv.Close)
	return origin{rec, srv.Listener.Addr().String()}
}

// TestModelProbeKeepsTheKeyAtItsOrigin: the probe of the model endpoint sends the API key to
// the base URL's origin (scheme, host and port) only, and follows no redirect to another
// origin, as the OpenAI client refuses one: the endpoint, or whoever answers for it, could
// otherwise send the key to the same host on another port or scheme or to a subdomain (Go's
// client forwards Authorization there), or have the worker probe any address. The refusal
// says what to configure, in the words /readyz shows. Names resolve, by the test's dialer, to
// loopback servers on ports of their own: models.test:80 is the endpoint.
func TestModelProbeKeepsTheKeyAtItsOrigin(t *testing.T) {
	const key = "sk-probe-secret"
	var location string // where the endpoint redirects the row's probe to
	var code int
	endpoint := newOrigin(t, false, func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/v1/models" {
			http.Redirect(w, r, location, code)
			return
		}
		_, _ = w.Write([]byte(`{"data":[]}`))
	})
	otherPort := newOrigin(t, false, func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte(`{"data":[]}`)) })
	otherScheme := newOrigin(t, true, func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte(`{"data":[]}`)) })
	subdomain := newOrigin(t, false, func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte(`{"data":[]}`)) })
	hosts := map[string]string{
		"models.test:80":     endpoint.addr,
		"models.test:8443":   otherPort.addr,
		"models.test:443":    otherScheme.addr,
		"api.models.test:80": subdomain.addr,
		otherPort.addr:       otherPort.addr,
		endpoint.addr:        endpoint.addr,
	}
	transport := &http.Transport{
		DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			to, ok := hosts[addr]
			if !ok {
				to = "127.0.0.1:1" // refused: the test sends nothing off loopback
			}
			var d net.Dialer
			return d.DialContext(ctx, network, to)
		},
		TLSClientConfig: &tls.Config{InsecureSkipVerify: true}, //nolint:gosec // the test's own loopback server
	}
	byName, err := newModelProbe("http://models.test/v1", key, transport, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	byAddr, err := newModelProbe("http://"+endpoint.addr+"/v1", key, transport, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	others := map[string]origin{"another port": otherPort, "another scheme": otherScheme, "a subdomain": subdomain}
	for _, tt := range []struct {
		name, location string
		byAddr         bool // the base URL is the endpoint's 127.0.0.1:port, not models.test
		followed       bool // a redirect within the origin is followed, with the key
	}{
		{"another port of 127.0.0.1", "http://" + otherPort.addr + "/v1/models", true, false},
		{"another port", "http://models.test:8443/v1/models", false, false},
		{"another scheme", "https://models.test/v1/models", false, false},
		{"a subdomain", "http://api.models.test/v1/models", false, false},
		{"another address", "http://" + otherPort.addr + "/v1/models", false, false},
		{"the same origin", "/v1/models-moved", false, true},
		{"the same origin, its port spelt", "http://models.test:80/v1/models-moved", false, true},
	} {
		for _, status := range []int{http.StatusFound, http.StatusTemporaryRedirect} {
			location, code = tt.location, status
			ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
			probe := byName
			if tt.byAddr {
				probe = byAddr
			}
			resp, err := probe.do(ctx)
			cancel()
			if resp != nil {
				resp.Body.Close()
			}
			for name, o := range others {
				if got := o.Take(); len(got) > 0 {
					t.Errorf("%s, %d: %s got %d requests (%q); want none: the probe follows no redirect off its origin",
						tt.name, status, name, len(got), got)
				}
			}
			switch got := endpoint.Take(); {
			case tt.followed && (err != nil || resp.StatusCode != http.StatusOK || len(got) != 2 || !strings.HasSuffix(got[1], " Authorization=Bearer "+key)):
				t.Errorf("%s, %d: %v, endpoint saw %d requests; want the redirect followed with the key", tt.name, status, err, len(got))
			case tt.followed:
			case err == nil:
				t.Errorf("%s, %d: probe answered %d; want the redirect refused", tt.name, status, resp.StatusCode)
			default:
				// /readyz shows the error's last words (modelgate): they must say what to set,
				// and nothing of the key or an address.
				words := redact.ErrorWords(err)
				if !strings.Contains(words, "model.base_url") || strings.Contains(err.Error(), key) {
					t.Errorf("%s, %d: refused with %q (on /readyz: %q); want it to name model.base_url", tt.name, status, err, words)
				}
			}
		}
	}
}
