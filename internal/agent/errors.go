package agent

import (
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/openai/openai-go/v3"

	"github.com/boxcar-run/boxcar/internal/textcut"
)

var (
	// ErrModelUnavailable marks a model endpoint that could not be reached or kept failing
	// (connection errors, request timeouts, a body that broke off, 408/409/429 and 5xx after
	// the client's retries). It is transient: the job may be retried later.
	ErrModelUnavailable = errors.New("model endpoint unavailable")
	// ErrModelAuth marks a request the endpoint refused for its credentials (401, 403, whatever
	// the body says). It is permanent and never retried: the operator has to fix the key.
	ErrModelAuth = errors.New("model endpoint refused the credentials")
	// ErrModelRequest marks a request the endpoint rejected as invalid (400, 404, 422 and other
	// 4xx), for example an unknown model name. It is permanent.
	ErrModelRequest = errors.New("model endpoint rejected the request")
	// ErrModelResponse marks an answer that is not a usable chat completion: no choices, a body
	// null, a body past Config.MaxResponseBytes, or a 2xx the client cannot decode (HTML, JSON
	// cut short). It is treated like any other error by callers that only know the three above
	// (transient).
	ErrModelResponse = errors.New("model endpoint sent an unusable response")
	// ErrInvalidRequest marks a Run request that cannot start: no sandbox, no model name, a
	// profile name New was not given, or (for a request that brings its own tools) a tool
	// declaration its kind refuses. It is permanent.
	ErrInvalidRequest = errors.New("invalid agent request")
	// ErrInvalidConfig marks a Config that New cannot use, a profile's tool declarations
	// included.
	ErrInvalidConfig = errors.New("invalid agent config")
)

// RetryAfterError is an ErrModelUnavailable whose endpoint said when to try it again: the run
// ended (the job's timeout passed while it waited, say) before then. Only a run with a Gate
// knows it; the caller should not send the job to the endpoint before Delay has passed.
type RetryAfterError struct {
	// Delay is how much longer, from the run's end, the endpoint asked to be left alone: its
	// Retry-After as the Gate bounds it (modelgate's MaxRetryAfter).
	Delay time.Duration
	Err   error
}

func (e *RetryAfterError) Error() string {
	return fmt.Sprintf("%v; the endpoint asked to be tried again in %s", e.Err, e.Delay.Round(time.Second))
}

func (e *RetryAfterError) Unwrap() error { return e.Err }

// unavailable is err, an ErrModelUnavailable, with the endpoint's Retry-After as gate knows it.
func unavailable(gate Gate, err error) error {
	if gate == nil {
		return err
	}
	if d := gate.RetryAfter(); d > 0 {
		return &RetryAfterError{Delay: d, Err: err}
	}
	return err
}

// Bounds on what of the endpoint's words a run keeps: they go into the run's error, and from
// there into the job's status, its dead letter, its manifest and logs.
const (
	// maxErrorMessage bounds an error's message, or the excerpt of an answer's body that says
	// what it was when it is not OpenAI's error object.
	maxErrorMessage = 300
	// maxAnswerField bounds each short field of an answer: an error's code, the response id,
	// the model name, the finish reason. Every server's own are a few dozen bytes.
	maxAnswerField = 128
)

// statusClasses is what the HTTP status of an answer that is not a usable chat completion
// means for the run, first match wins. It is read whatever the body holds: an endpoint that is
// not OpenAI's (TGI, LM Studio, a proxy) may answer {"error":"..."} or a page of HTML, which
// openai-go cannot decode and reports without the status.
var statusClasses = []struct {
	lo, hi int // the statuses the row covers, both included
	class  error
}{
	{http.StatusUnauthorized, http.StatusUnauthorized, ErrModelAuth},
	{http.StatusForbidden, http.StatusForbidden, ErrModelAuth},
	// The statuses the client retries: the endpoint is overloaded or down, not the request bad.
	{http.StatusRequestTimeout, http.StatusRequestTimeout, ErrModelUnavailable},
	{http.StatusConflict, http.StatusConflict, ErrModelUnavailable},
	{http.StatusTooManyRequests, http.StatusTooManyRequests, ErrModelUnavailable},
	{500, 999, ErrModelUnavailable},
	{400, 499, ErrModelRequest},
	// An answer below 400 the client could not decode: answered, but not a chat completion
	// (a wrong base URL's HTML, JSON cut short).
	{100, 399, ErrModelResponse},
}

// statusClass is the row of statusClasses for code.
func statusClass(code int) error {
	for _, row := range statusClasses {
		if code >= row.lo && code <= row.hi {
			return row.class
		}
	}
	return ErrModelResponse
}

// modelError translates an error of the openai client into one of the package's sentinels,
// by the HTTP status of the last attempt's answer (rp) whenever there was one. The client's
// *openai.Error is not kept in the chain: it holds the HTTP request, headers and API key
// included. What the endpoint said (its error's code and message, or an excerpt of its body)
// is bounded and apiKey redacted from it (endpointText).
func modelError(err error, rp *reply, apiKey string) error {
	if errors.Is(err, errResponseTooLarge) {
		// Checked first: the bound may cut an error answer's body too (openai-go then returns
		// the read error alone).
		return fmt.Errorf("agent: chat completion: %w: %w", ErrModelResponse, err)
	}
	if rp.status == 0 || rp.readErr != nil {
		// No answer at all (refused connection, DNS, TLS, a per-request timeout), or one whose
		// body broke off while it was read.
		return fmt.Errorf("agent: chat completion: %w: %v", ErrModelUnavailable, err)
	}
	return fmt.Errorf("agent: chat completion: %w: %s", statusClass(rp.status), rp.detail(err, apiKey))
}

// detail says what the endpoint answered: the status, then the code and message of OpenAI's
// error object when the client could read one, else an excerpt of the body.
func (rp *reply) detail(err error, apiKey string) string {
	detail := fmt.Sprintf("HTTP %d", rp.status)
	var apiErr *openai.Error
	if errors.As(err, &apiErr) {
		if code := endpointText(apiErr.Code, apiKey, maxAnswerField); code != "" {
			detail += " " + code
		}
		if msg := endpointText(apiErr.Message, apiKey, maxErrorMessage); msg != "" {
			detail += ": " + msg
		}
		return detail
	}
	if rp.status < 400 {
		// The decoder's words say where the body went wrong ("unexpected EOF", "invalid
		// character '<'"); for an error status they only say that it was not OpenAI's shape.
		detail += ": not a chat completion (" + endpointText(err.Error(), apiKey, maxErrorMessage) + ")"
	}
	if body := endpointText(string(rp.head), apiKey, maxErrorMessage); body != "" {
		detail += ": " + body
	}
	return detail
}

// endpointText makes text the endpoint sent fit to go into an error, a log line, the job's
// status or its manifest: apiKey redacted, invalid UTF-8 and control characters (newlines,
// terminal escapes) replaced, and cut to at most n bytes, "…" included, on a rune boundary.
func endpointText(s, apiKey string, n int) string {
	if apiKey != "" {
		s = strings.ReplaceAll(s, apiKey, "[redacted]")
	}
	if len(s) > 4*n {
		s = s[:4*n] // the rest can only be cut below; the head is what stays
	}
	s = strings.Map(func(r rune) rune {
		if unicode.IsControl(r) || r == utf8.RuneError {
			return ' '
		}
		return r
	}, strings.ToValidUTF8(s, "\uFFFD"))
	if len(s) <= n {
		return s
	}
	const ellipsis = "…"
	return textcut.Head(s, n-len(ellipsis)) + ellipsis
}
