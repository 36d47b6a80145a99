// Package agent owns the loop that lets a model work on one job: chat completions against an
// OpenAI-compatible endpoint (through openai-go), the tool registry (the built-in file tools,
// named command tools and the shell under its approval policy), argument validation with JSON
// Schema, output caps, the run's caps (turns, tool calls, tokens, job timeout) and the
// transcript. Tools run in a Sandbox the caller started and closes; the agent decides what may
// run there, the sandbox how it is contained. It knows nothing of queues or storage.
package agent

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"

	"github.com/boxcar-run/boxcar/internal/config"
	"github.com/boxcar-run/boxcar/internal/modelgate"
	"github.com/boxcar-run/boxcar/internal/redact"
	"github.com/boxcar-run/boxcar/internal/sandbox"
)

// Sandbox is what the tools need from a sandbox.
type Sandbox interface {
	Exec(ctx context.Context, req sandbox.ExecRequest) (sandbox.ExecResult, error)
	ReadFile(ctx context.Context, name string, maxBytes int64) ([]byte, error)
	WriteFile(ctx context.Context, name string, data []byte) error
	List(ctx context.Context, dir string) ([]sandbox.FileInfo, error)
}

var _ Sandbox = sandbox.Sandbox(nil)

// Gate holds model requests while the endpoint is down; internal/modelgate's Gate is one.
type Gate interface {
	// Transport wraps next: every attempt through it is recorded, and refused while the
	// endpoint is down.
	Transport(next http.RoundTripper) http.RoundTripper
	// Up reports whether requests pass: false once failures persist, until a probe is
	// answered.
	Up() bool
	// Held says whether a turn whose request the endpoint just failed (unavailable) is to
	// wait until it is up again (modelgate.Hold), or fails: modelgate.Own when the failures
	// were the job's own (ctx names it: modelgate.WithJob), the endpoint answering the rest.
	Held(ctx context.Context) modelgate.Verdict
	// Wait returns at once while the endpoint is up, else when it is up again or ctx ends
	// (then with context.Cause(ctx)).
	Wait(ctx context.Context) error
	// RetryAfter is how much longer the endpoint asked to be left alone (its latest
	// Retry-After, bounded), zero when it asked for nothing or answered since.
	RetryAfter() time.Duration
}

// DefaultBaseURL is the endpoint used when Config.BaseURL is empty.
const DefaultBaseURL = "https://api.openai.com/v1"

// DefaultMaxResponseBytes bounds the body of one answer of the endpoint when
// Config.MaxResponseBytes is not set: some hundred times what a long completion with tool calls
// takes, and little enough that a worker running jobs side by side can hold one of each.
const DefaultMaxResponseBytes = 16 << 20

// Config configures an Agent. New fills every unset field with its default.
type Config struct {
	// BaseURL of the OpenAI-compatible API, up to and including the version segment:
	// "https://api.openai.com/v1", "http://127.0.0.1:8000/v1". Default: DefaultBaseURL.
	BaseURL string
	// APIKey is sent as a bearer token; empty sends no Authorization header (local servers).
	// It is never logged and never written to a transcript.
	APIKey string
	// HTTPClient carries the requests. Default: a client of the agent's own with the standard
	// transport settings and no overall timeout (RequestTimeout bounds each attempt).
	HTTPClient *http.Client
	// RequestTimeout bounds one attempt of one chat request. Default: 120s.
	RequestTimeout time.Duration
	// MaxResponseBytes bounds the body of each answer, error answers included: the client reads
	// a body whole, and an endpoint (hostile, broken, or a proxy in front of it) could send
	// gigabytes. A body past it ends the run with ErrModelResponse while it is read, holding no
	// more than that. Default: DefaultMaxResponseBytes.
	MaxResponseBytes int64
	// MaxRetries is how often a failed attempt is retried: connection errors, 408, 409, 429
	// and 5xx, honouring Retry-After (up to 2 minutes) or backing off exponentially (0.5s
	// doubling, at most 8s). 401/403 and other 4xx are never retried. Default: 3; a negative
	// value means no retries.
	MaxRetries int
	// Logger receives the agent's log lines; each carries job_id. Default: discard.
	Logger *slog.Logger
	// Gate, when set, is the endpoint's circuit breaker: New wraps HTTPClient's transport in
	// the gate's, so it sees every attempt, and a turn whose request found the endpoint
	// unavailable while the gate holds requests (it opened: the failures persist) waits on it
	// and is sent again, within the job's timeout, instead of ending the run with
	// ErrModelUnavailable. Optional: without it, or when the gate is still open to requests,
	// such a run ends at once, as the caller then retries it.
	Gate Gate
	// Profiles are the execution profiles whose tools New checks and compiles once, so that a
	// mistake in one stops the worker at start; a Request names one by ProfileName. Optional:
	// a Request without ProfileName brings its tools in Profile and has them compiled per run.
	Profiles map[string]config.Profile
}

// WithDefaults returns a copy with every unset field at its documented default.
func (c Config) WithDefaults() Config {
	if c.BaseURL == "" {
		c.BaseURL = DefaultBaseURL
	}
	if c.HTTPClient == nil {
		c.HTTPClient = &http.Client{Transport: http.DefaultTransport.(*http.Transport).Clone()}
	}
	if c.RequestTimeout == 0 {
		c.RequestTimeout = 120 * time.Second
	}
	if c.MaxResponseBytes == 0 {
		c.MaxResponseBytes = DefaultMaxResponseBytes
	}
	if c.MaxRetries == 0 {
		c.MaxRetries = 3
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	return c
}

func (c Config) validate() error {
	// The error names the URL redacted: one that does not parse may hold a password whole.
	if _, err := redact.ParseHTTPURL(c.BaseURL); err != nil {
		return fmt.Errorf("%w: BaseURL: %w; e.g. %s or http://127.0.0.1:8000/v1", ErrInvalidConfig, err, DefaultBaseURL)
	}
	if c.MaxResponseBytes < 0 {
		return fmt.Errorf("%w: MaxResponseBytes %d is negative; use a positive size or 0 for the default (%d)",
			ErrInvalidConfig, c.MaxResponseBytes, DefaultMaxResponseBytes)
	}
	if c.RequestTimeout < 0 {
		return fmt.Errorf("%w: RequestTimeout %s is negative; use a positive duration or 0 for the default",
			ErrInvalidConfig, c.RequestTimeout)
	}
	return nil
}

// Agent runs jobs against one model endpoint. It is safe for concurrent use: each Run has its
// own state.
type Agent struct {
	cfg      Config
	chat     openai.ChatCompletionService
	schemas  schemaCache
	profiles map[string]*compiledTools // Config.Profiles' tools, by profile name
}

// New returns an Agent for the endpoint cfg names, with the tools of cfg.Profiles compiled. It
// does not contact the endpoint. A profile whose tools are not usable makes it fail with
// ErrInvalidConfig, each problem naming the profile, the tool and the field.
func New(cfg Config) (*Agent, error) {
	cfg = cfg.WithDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	a := &Agent{cfg: cfg}
	profiles, err := compileProfiles(&a.schemas, cfg.Profiles)
	if err != nil {
		return nil, err
	}
	a.profiles = profiles
	client := cfg.HTTPClient
	if cfg.Gate != nil {
		gated := *client
		gated.Transport = cfg.Gate.Transport(client.Transport)
		client = &gated
	}
	opts := []option.RequestOption{
		option.WithBaseURL(cfg.BaseURL),
		option.WithHTTPClient(client),
		option.WithMaxRetries(max(cfg.MaxRetries, 0)),
		option.WithRequestTimeout(cfg.RequestTimeout),
		option.WithMiddleware(capBody(cfg.MaxResponseBytes)),
	}
	if cfg.APIKey != "" {
		opts = append(opts, option.WithAPIKey(cfg.APIKey))
	}
	// The service, unlike openai.NewClient, reads nothing from the environment: only cmd/*
	// does that.
	a.chat = openai.NewChatCompletionService(opts...)
	return a, nil
}
