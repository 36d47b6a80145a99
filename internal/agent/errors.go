package agent

import (
	"errors"
	"fmt"
	"net/http"
	"strings"

	"github.com/openai/openai-go/v3"
)

var (
	// ErrModelUnavailable marks a model endpoint that could not be reached or kept failing
	// (connection errors, request timeouts, 408/409/429 and 5xx after the client's retries).
	// It is transient: the job may be retried later.
	ErrModelUnavailable = errors.New("model endpoint unavailable")
	// ErrModelAuth marks a request the endpoint refused for its credentials (401, 403). It is
	// permanent and never retried: the operator has to fix the key.
	ErrModelAuth = errors.New("model endpoint refused the credentials")
	// ErrModelRequest marks a request the endpoint rejected as invalid (400, 404, 422 and other
	// 4xx), for example an unknown model name. It is permanent.
	ErrModelRequest = errors.New("model endpoint rejected the request")
	// ErrModelResponse marks an answer that is not a usable chat completion: no choices, a body
	// null, or a body past Config.MaxResponseBytes. It is treated like any other error by
	// callers that only know the three above (transient).
	ErrModelResponse = errors.New("model endpoint sent an unusable response")
	// ErrInvalidRequest marks a Run request that cannot start: no sandbox, no model name, a
	// profile name New was not given, or (for a request that brings its own tools) a tool
	// declaration its kind refuses. It is permanent.
	ErrInvalidRequest = errors.New("invalid agent request")
	// ErrInvalidConfig marks a Config that New cannot use, a profile's tool declarations
	// included.
	ErrInvalidConfig = errors.New("invalid agent config")
)

// maxErrorMessage bounds how much of an endpoint's error message is kept.
const maxErrorMessage = 300

// modelError translates an error of the openai client into one of the package's sentinels.
// The client's *openai.Error is not kept in the chain: it holds the HTTP request, headers and
// API key included. apiKey is redacted from the endpoint's message.
func modelError(err error, apiKey string) error {
	if errors.Is(err, errResponseTooLarge) {
		// Checked first: the bound may cut an error answer's body too (openai-go then returns
		// the read error alone).
		return fmt.Errorf("agent: chat completion: %w: %w", ErrModelResponse, err)
	}
	var apiErr *openai.Error
	if !errors.As(err, &apiErr) {
		// No HTTP response at all: refused connection, DNS, TLS, a per-request timeout.
		return fmt.Errorf("agent: chat completion: %w: %v", ErrModelUnavailable, err)
	}
	var kind error
	switch code := apiErr.StatusCode; {
	case code == http.StatusUnauthorized || code == http.StatusForbidden:
		kind = ErrModelAuth
	case code == http.StatusRequestTimeout || code == http.StatusConflict ||
		code == http.StatusTooManyRequests || code >= 500:
		kind = ErrModelUnavailable
	default:
		kind = ErrModelRequest
	}
	msg := apiErr.Message
	if apiKey != "" {
		msg = strings.ReplaceAll(msg, apiKey, "[redacted]")
	}
	if len(msg) > maxErrorMessage {
		msg = msg[:maxErrorMessage] + "…"
	}
	detail := fmt.Sprintf("HTTP %d", apiErr.StatusCode)
	if apiErr.Code != "" {
		detail += " " + apiErr.Code
	}
	if msg != "" {
		detail += ": " + msg
	}
	return fmt.Errorf("agent: chat completion: %w: %s", kind, detail)
}
