package workercmd

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"strings"

	"github.com/boxcar-run/boxcar/internal/metrics"
	"github.com/boxcar-run/boxcar/internal/modelgate"
	"github.com/boxcar-run/boxcar/internal/redact"
)

// newModelGate is the model endpoint's circuit breaker: it sets boxcar_model_up, and probes
// with GET <base URL>/models, which every OpenAI-compatible server serves, with the API key so
// that the probe meets what a chat request meets. Probes use the jobs' transport (a private CA
// included) but go around the metrics transport:
// boxcar_model_requests_total counts the jobs' requests only.
func newModelGate(baseURL, apiKey string, transport *http.Transport, m *metrics.Metrics, log *slog.Logger) (*modelgate.Gate, error) {
	client := &http.Client{Transport: transport} // the jobs' transport (its CA), not their metrics
	url := strings.TrimRight(baseURL, "/") + "/models"
	// A request error would quote the URL, and Err shows it on /readyz: parse it once here.
	if _, err := redact.ParseHTTPURL(url); err != nil {
		return nil, fmt.Errorf("model base URL: %w", err)
	}
	return modelgate.New(modelgate.Config{
		Probe: func(ctx context.Context) (*http.Response, error) {
			req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
			if err != nil {
				return nil, err
			}
			if apiKey != "" {
				req.Header.Set("Authorization", "Bearer "+apiKey)
			}
			return client.Do(req)
		},
		OnChange: m.SetModelUp,
		Logger:   log,
	})
}
