package workercmd

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"strings"

	"github.com/boxcar-run/boxcar/internal/metrics"
	"github.com/boxcar-run/boxcar/internal/modelgate"
	"github.com/boxcar-run/boxcar/internal/redact"
)

// newModelGate is the model endpoint's circuit breaker: it sets boxcar_model_up, counts
// boxcar_model_failure_verdicts_total, and probes with modelProbe. Probes use the jobs'
// transport (a private CA included) but go around the metrics transport:
// boxcar_model_requests_total counts the jobs' requests only.
func newModelGate(baseURL, apiKey string, transport *http.Transport, m *metrics.Metrics, log *slog.Logger) (*modelgate.Gate, error) {
	probe, err := newModelProbe(baseURL, apiKey, transport, log)
	if err != nil {
		return nil, err
	}
	return modelgate.New(modelgate.Config{Probe: probe.do, OnChange: m.SetModelUp, OnVerdict: m.ModelVerdict, Logger: log})
}

// errRedirectedAway is a probe the endpoint redirected off the base URL's origin. Its words
// hold no ": ", so /readyz shows them whole (redact.ErrorWords), and no address.
var errRedirectedAway = errors.New("the endpoint redirected the probe to another origin (scheme, host or port), " +
	"which the probe does not follow and the API key never goes to; set model.base_url (or OPENAI_BASE_URL) to the URL the endpoint answers at")

// maxProbeRedirects is how many redirects within the origin a probe follows, as Go's client.
const maxProbeRedirects = 10

// modelProbe sends GET <base URL>/models, which every OpenAI-compatible server serves, with
// the API key so that the probe meets what a chat request meets. It follows redirects within
// the base URL's origin only, as the OpenAI client does for the jobs' requests: Go's client
// would follow any, sending the key along to the same host on another port or scheme and to
// its subdomains. The log names where a refused redirect went (its origin only).
type modelProbe struct {
	client      *http.Client
	url, apiKey string
}

func newModelProbe(baseURL, apiKey string, transport *http.Transport, log *slog.Logger) (*modelProbe, error) {
	url := strings.TrimRight(baseURL, "/") + "/models"
	// A request error would quote the URL, and Err shows it on /readyz: parse it once here.
	origin, err := redact.ParseHTTPURL(url)
	if err != nil {
		return nil, fmt.Errorf("model base URL: %w", err)
	}
	client := &http.Client{
		Transport: transport, // the jobs' transport (its CA), not their metrics
		CheckRedirect: func(req *http.Request, via []*http.Request) error {
			if !sameOrigin(req.URL, origin) {
				log.Warn("model endpoint probe redirected to another origin; not followed, set model.base_url to the URL the endpoint answers at",
					"redirect_to", req.URL.Scheme+"://"+req.URL.Host)
				return errRedirectedAway
			}
			if len(via) >= maxProbeRedirects {
				return fmt.Errorf("stopped after %d redirects", maxProbeRedirects)
			}
			return nil
		},
	}
	return &modelProbe{client: client, url: url, apiKey: apiKey}, nil
}

// do sends one probe.
func (p *modelProbe) do(ctx context.Context) (*http.Response, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, p.url, nil)
	if err != nil {
		return nil, err
	}
	if p.apiKey != "" {
		req.Header.Set("Authorization", "Bearer "+p.apiKey)
	}
	resp, err := p.client.Do(req)
	if err != nil && resp != nil {
		resp = nil // a refused redirect's answer, its body closed: the error says it
	}
	return resp, err
}

// sameOrigin is whether a and b have one scheme, host and port (the scheme's when none is
// given), as the OpenAI client compares a request with its base URL.
func sameOrigin(a, b *url.URL) bool {
	return strings.EqualFold(a.Scheme, b.Scheme) && strings.EqualFold(a.Hostname(), b.Hostname()) && effectivePort(a) == effectivePort(b)
}

// effectivePort is u's port, or its scheme's.
func effectivePort(u *url.URL) string {
	if p := u.Port(); p != "" {
		return p
	}
	if strings.EqualFold(u.Scheme, "https") {
		return "443"
	}
	return "80"
}
