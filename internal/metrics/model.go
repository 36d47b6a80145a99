package metrics

import (
	"context"
	"errors"
	"net"
	"net/http"
	"time"

	"github.com/boxcar-run/boxcar/internal/bodyend"
)

// Outcomes of one request to the model endpoint, the values of boxcar_model_requests_total's
// outcome label.
const (
	ModelOK          = "ok"           // 2xx
	ModelRateLimited = "rate_limited" // 429
	ModelClientError = "client_error" // other 4xx (bad request, authentication)
	ModelServerError = "server_error" // 5xx and anything else unexpected
	ModelTimeout     = "timeout"      // no answer in time
	ModelError       = "error"        // no answer at all: connection refused, reset, cancelled
)

// ModelTransport wraps next (nil: http.DefaultTransport) so that every request through it,
// each retry of the OpenAI client included, is counted by outcome and timed until its body
// has been read or closed. The outcome of an answer with a body is decided when the body ends:
// a 200 whose body breaks off or stalls past the request's deadline gave the agent no answer
// and is an error or a timeout, not ok. A body its reader closes before its end (the agent's
// Config.MaxResponseBytes) keeps its status's outcome: the endpoint answered, and the agent
// counts the answer unusable. Give it to the agent as its HTTP client's transport.
func (m *Metrics) ModelTransport(next http.RoundTripper) http.RoundTripper {
	if next == nil {
		next = http.DefaultTransport
	}
	return &modelTransport{next: next, m: m}
}

type modelTransport struct {
	next http.RoundTripper
	m    *Metrics
}

func (t *modelTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	start := time.Now()
	resp, err := t.next.RoundTrip(req)
	if err != nil {
		t.observe(errorOutcome(req.Context(), err), start)
		return resp, err
	}
	outcome := statusOutcome(resp.StatusCode)
	if resp.Body == nil || resp.Body == http.NoBody {
		t.observe(outcome, start)
		return resp, nil
	}
	resp.Body = bodyend.Watch(resp.Body, func(readErr error) {
		if readErr != nil || req.Context().Err() != nil {
			outcome = errorOutcome(req.Context(), readErr)
		}
		t.observe(outcome, start)
	})
	return resp, nil
}

func (t *modelTransport) observe(outcome string, start time.Time) {
	t.m.ModelRequests.WithLabelValues(outcome).Inc()
	t.m.ModelRequestDuration.WithLabelValues(outcome).Observe(time.Since(start).Seconds())
}

func statusOutcome(code int) string {
	switch {
	case code >= 200 && code < 300:
		return ModelOK
	case code == http.StatusTooManyRequests:
		return ModelRateLimited
	case code == http.StatusRequestTimeout:
		return ModelTimeout
	case code >= 400 && code < 500:
		return ModelClientError
	}
	return ModelServerError
}

// errorOutcome is the outcome of a request that failed with err (nil: its body was closed
// before its end) under ctx: a timeout when either says so, an error otherwise.
func errorOutcome(ctx context.Context, err error) string {
	var ne net.Error
	if errors.Is(ctx.Err(), context.DeadlineExceeded) || errors.Is(err, context.DeadlineExceeded) ||
		(errors.As(err, &ne) && ne.Timeout()) {
		return ModelTimeout
	}
	return ModelError
}
