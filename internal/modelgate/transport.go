package modelgate

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/boxcar-run/boxcar/internal/bodyend"
	"github.com/boxcar-run/boxcar/internal/redact"
)

// Transport wraps next (nil: http.DefaultTransport): every request through it is refused with
// ErrOpen while the breaker is not closed, and every answer is recorded. Give it to the agent's
// HTTP client, inside any retries, so that each attempt counts.
//
// An answer the breaker counts as one is recorded when its body ends: a 200 whose body breaks
// off or stalls past the request's deadline is no answer (the agent calls it
// ErrModelUnavailable, and the client retries it). One whose reader closes it before its end
// (the agent's Config.MaxResponseBytes) is an answer: the endpoint is up.
func (g *Gate) Transport(next http.RoundTripper) http.RoundTripper {
	if next == nil {
		next = http.DefaultTransport
	}
	return &transport{g: g, next: next}
}

// jobKey is the context key of WithJob.
type jobKey struct{}

// WithJob names the job whose requests (through Transport) and calls of Held go with ctx: the
// breaker tells one job's failures from an outage by them. Requests that name no job count as
// the failures of many, as before jobs were told apart.
func WithJob(ctx context.Context, job string) context.Context {
	return context.WithValue(ctx, jobKey{}, job)
}

func jobOf(ctx context.Context) string {
	job, _ := ctx.Value(jobKey{}).(string)
	return job
}

type transport struct {
	g    *Gate
	next http.RoundTripper
}

func (t *transport) RoundTrip(req *http.Request) (*http.Response, error) {
	if !t.g.Up() {
		if req.Body != nil {
			req.Body.Close() // a RoundTripper closes the body, even on error
		}
		return nil, ErrOpen
	}
	ctx := req.Context()
	job := jobOf(ctx)
	resp, err := t.next.RoundTrip(req)
	if err != nil && errors.Is(ctx.Err(), context.Canceled) {
		return resp, err // the caller gave up (a cancelled job, a shutdown): no news of the endpoint
	}
	a := classify(ctx, resp, err)
	if a.failed || resp.Body == nil || resp.Body == http.NoBody {
		t.g.observe(a, job)
		return resp, err
	}
	resp.Body = bodyend.Watch(resp.Body, func(readErr error) {
		if readErr == nil && ctx.Err() == nil {
			t.g.observe(a, job)
		} else if !errors.Is(ctx.Err(), context.Canceled) {
			t.g.observe(brokenBody(ctx, readErr), job)
		}
	})
	return resp, nil
}

// brokenBody is the answer of a request whose body broke off with readErr (nil: its reader
// closed it after ctx ended).
func brokenBody(ctx context.Context, readErr error) answer {
	if ctx.Err() != nil || errors.Is(readErr, context.DeadlineExceeded) {
		return answer{failed: true, why: "no answer in time: the body stalled"}
	}
	return answer{failed: true, why: "the answer broke off: " + redact.ErrorWords(readErr)}
}

// classify turns the result of one request into an answer. A request that got no response
// (refused, reset, timed out) or one of the statuses the OpenAI client retries (408, 409,
// 429, 5xx) is a failure, as the agent counts ErrModelUnavailable; anything else, 4xx
// included, proves the endpoint answers.
func classify(ctx context.Context, resp *http.Response, err error) answer {
	if err != nil {
		if ctx.Err() != nil {
			return answer{failed: true, why: "no response in time"}
		}
		// Err shows why on /readyz: the error's words, never the endpoint's address.
		return answer{failed: true, why: "no response: " + redact.ErrorWords(err)}
	}
	switch code := resp.StatusCode; {
	case code == http.StatusRequestTimeout, code == http.StatusConflict,
		code == http.StatusTooManyRequests, code >= 500:
		wait := retryAfter(resp.Header, time.Now())
		final := wait > clientMaxRetryAfter || strings.EqualFold(resp.Header.Get("X-Should-Retry"), "false")
		busy := code == http.StatusTooManyRequests || wait > 0
		return answer{failed: true, why: fmt.Sprintf("HTTP %d", code), retryAfter: wait, final: final, busy: busy}
	}
	return answer{}
}

// clientMaxRetryAfter is the longest Retry-After the OpenAI client waits for before it tries
// again; it gives up on an answer that asks for longer (openai-go's limit).
const clientMaxRetryAfter = 2 * time.Minute

// retryAfter reads the delay an answer asks for: retry-after-ms (OpenAI's), or Retry-After
// in seconds or as an HTTP date. Zero when there is none or it does not parse.
func retryAfter(h http.Header, now time.Time) time.Duration {
	if ms, ok := delay(h.Get("Retry-After-Ms"), time.Millisecond); ok {
		return ms
	}
	v := h.Get("Retry-After")
	if s, ok := delay(v, time.Second); ok {
		return s
	}
	if t, err := http.ParseTime(v); err == nil && t.After(now) {
		return t.Sub(now)
	}
	return 0
}

// delay reads v as a number of units, as the OpenAI client does (fractions allowed); one past
// what a Duration holds is the longest Duration. ok is false when v is no positive number.
func delay(v string, unit time.Duration) (time.Duration, bool) {
	n, err := strconv.ParseFloat(v, 64)
	switch {
	case err != nil && !errors.Is(err, strconv.ErrRange), math.IsNaN(n), n <= 0:
		return 0, false
	case n >= float64(math.MaxInt64)/float64(unit):
		return math.MaxInt64, true
	}
	return time.Duration(n * float64(unit)), true
}
