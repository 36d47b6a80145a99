// Package modelgate owns the model endpoint's circuit breaker: it watches every HTTP request
// to the endpoint (Transport), opens when the endpoint stops answering (no response, or 408,
// 409, 429, 5xx, several times in a row, or once when the client will not retry the answer:
// x-should-retry: false, a Retry-After past its 2 minutes), refuses requests while open, probes with backoff
// (honouring Retry-After) and closes when a probe is answered. A run of failures of one job's
// requests alone (WithJob) does not open it: the probe judges them first (Held), so that one
// job whose context the server fails on holds no other job. Callers wait on it (Wait): the
// agent before it sends a turn again, the runner before it fetches a job. It knows nothing of
// queues or metrics; OnChange tells whoever cares.
package modelgate

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"sync"
	"time"
)

// Config configures a Gate. New fills every unset field with its default.
type Config struct {
	// Threshold is how many requests in a row must fail before the breaker opens. Default: 3
	// (with the agent's default of 3 retries, one chat request that fails every attempt). When
	// they are all one job's, it opens only once the probe fails too (Held). A
	// failure the OpenAI client does not retry (x-should-retry: false, a Retry-After longer
	// than its 2 minutes) opens it at once: that request ends with it.
	Threshold int
	// MinBackoff is the wait before the first probe after the breaker opens; each failed probe
	// doubles it, up to MaxBackoff. Defaults: 1s and 30s.
	MinBackoff time.Duration
	MaxBackoff time.Duration
	// MaxRetryAfter bounds the Retry-After (or retry-after-ms) an answer may ask for; the next
	// probe waits for it when it is longer than the backoff, and RetryAfter reports it.
	// Default: 5m.
	MaxRetryAfter time.Duration
	// ProbeTimeout bounds one probe. Default: 10s.
	ProbeTimeout time.Duration
	// Probe sends one cheap request to the endpoint (GET /models, say) and returns its
	// response, whose body the gate reads (its first MiB) and closes. Any answer but 408, 409,
	// 429 or 5xx whose body arrives closes the breaker: a 401 or 404 still says the endpoint is
	// up. Required.
	Probe func(ctx context.Context) (*http.Response, error)
	// OnChange is called with false when the breaker opens and true when it closes, in order,
	// with the gate's lock held: it must be quick (set a gauge). Optional.
	OnChange func(up bool)
	// OnVerdict is called when a probe judges one job's failures (Held): with true when they
	// were the job's own (the probe was answered), false when it found an outage (the breaker
	// opens). With the gate's lock held: it must be quick (count it). Optional.
	OnVerdict func(own bool)
	// Logger receives a line when the breaker opens and when it closes. Default: discard.
	Logger *slog.Logger
	// now is the clock; tests set it.
	now func() time.Time
}

// WithDefaults returns a copy with every unset field at its documented default.
func (c Config) WithDefaults() Config {
	if c.Threshold == 0 {
		c.Threshold = 3
	}
	if c.MinBackoff == 0 {
		c.MinBackoff = time.Second
	}
	if c.MaxBackoff == 0 {
		c.MaxBackoff = 30 * time.Second
	}
	if c.MaxRetryAfter == 0 {
		c.MaxRetryAfter = 5 * time.Minute
	}
	if c.ProbeTimeout == 0 {
		c.ProbeTimeout = 10 * time.Second
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	if c.now == nil {
		c.now = time.Now
	}
	return c
}

func (c Config) validate() error {
	switch {
	case c.Probe == nil:
		return fmt.Errorf("%w: Probe is required: a function that sends one cheap request to the endpoint", ErrInvalidConfig)
	case c.Threshold < 1:
		return fmt.Errorf("%w: Threshold %d: use 1 or more", ErrInvalidConfig, c.Threshold)
	case c.MinBackoff < 0 || c.MaxBackoff < c.MinBackoff:
		return fmt.Errorf("%w: MinBackoff %s, MaxBackoff %s: use 0 < MinBackoff <= MaxBackoff", ErrInvalidConfig, c.MinBackoff, c.MaxBackoff)
	case c.MaxRetryAfter < 0 || c.ProbeTimeout < 0:
		return fmt.Errorf("%w: MaxRetryAfter and ProbeTimeout must not be negative", ErrInvalidConfig)
	}
	return nil
}

// Gate is the circuit breaker of one model endpoint. It is safe for concurrent use.
type Gate struct {
	cfg Config

	mu sync.Mutex
	b  breaker
	// changed is closed and replaced at every state change and after every probe: waiters
	// look again.
	changed chan struct{}
	probing bool // a caller of Wait is sending the probe
}

// New returns a closed Gate.
func New(cfg Config) (*Gate, error) {
	cfg = cfg.WithDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	return &Gate{cfg: cfg, changed: make(chan struct{}), b: breaker{
		threshold: cfg.Threshold, minBackoff: cfg.MinBackoff, maxBackoff: cfg.MaxBackoff, maxWait: cfg.MaxRetryAfter,
	}}, nil
}

// State is the breaker's state now.
func (g *Gate) State() State {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.b.state
}

// Up reports whether requests pass: the breaker is closed.
func (g *Gate) Up() bool { return g.State() == Closed }

// Err is nil while the breaker is closed; otherwise it says since when the endpoint is down,
// why, and when it is probed next (for /readyz). It holds no URL and no header.
func (g *Gate) Err() error {
	g.mu.Lock()
	defer g.mu.Unlock()
	b := g.b
	switch b.state {
	case Closed:
		return nil
	case HalfOpen:
		return fmt.Errorf("model endpoint down since %s (%s); probing it now", b.downSince.UTC().Format(time.RFC3339), b.why)
	}
	return fmt.Errorf("model endpoint down since %s (%s); next probe in %s", b.downSince.UTC().Format(time.RFC3339),
		b.why, max(b.probeAt.Sub(g.cfg.now()), 0).Round(time.Second))
}

// RetryAfter is how much longer the endpoint asked to be left alone: the latest Retry-After
// (or retry-after-ms) of a failed answer, request or probe, bounded by MaxRetryAfter and
// counted from that answer. Zero when none named one, once it has passed, and once the
// endpoint answered since.
func (g *Gate) RetryAfter() time.Duration {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.b.retryAt.IsZero() {
		return 0
	}
	return max(g.b.retryAt.Sub(g.cfg.now()), 0)
}

// Wait returns nil at once while the breaker is closed, even when ctx has ended. While it is open, it waits until it
// closes, sending the probe itself when one is due and no other caller is sending it. It
// returns context.Cause(ctx) when ctx ends first.
func (g *Gate) Wait(ctx context.Context) error {
	for {
		g.mu.Lock()
		if g.b.state == Closed {
			g.mu.Unlock()
			return nil
		}
		if ctx.Err() != nil {
			g.mu.Unlock()
			return context.Cause(ctx)
		}
		changed := g.changed
		probe := !g.probing && g.b.probeDue(g.cfg.now())
		wait := g.b.probeAt.Sub(g.cfg.now())
		if probe || g.probing {
			wait = -1 // no timer: the probe's end wakes the waiters
		}
		g.probing = g.probing || probe
		g.mu.Unlock()

		if probe {
			g.probe(ctx)
			continue
		}
		if err := sleep(ctx, changed, wait); err != nil {
			return err
		}
	}
}

// sleep waits until changed is closed, d passes (never when d < 0) or ctx ends.
func sleep(ctx context.Context, changed <-chan struct{}, d time.Duration) error {
	var timer <-chan time.Time
	if d >= 0 {
		t := time.NewTimer(d)
		defer t.Stop()
		timer = t.C
	}
	select {
	case <-ctx.Done():
		return context.Cause(ctx)
	case <-changed:
	case <-timer:
	}
	return nil
}

// maxProbeBody is how much of a probe's body the gate reads: a list of models is some KiB.
const maxProbeBody = 1 << 20

// Verdict is what Held found of a turn whose request the endpoint just failed.
type Verdict int

// Verdicts of Held.
const (
	// Pass: the failures do not persist (or ctx ended first): the turn fails as without a gate.
	Pass Verdict = iota
	// Hold: the breaker is open: the turn waits until the endpoint answers again (Wait).
	Hold
	// Own: the failures were the job's own: the endpoint answered the probe, or another
	// request, while the job's failed. The turn fails; its caller's retry policy decides.
	Own
)

func (v Verdict) String() string {
	return [...]string{Pass: "pass", Hold: "hold", Own: "own"}[v]
}

// Held says whether the job of ctx (WithJob), whose request the endpoint just failed, is to
// hold its turn until the endpoint answers again (Hold: the breaker is open). When that job's
// failures alone made the run that would have opened it, Held first probes the endpoint, or
// waits for the probe another caller sends: a failed probe opens the breaker (Hold); an
// answered one, or any request answered meanwhile, says the failures are the job's own (Own):
// its turn fails, and its caller's retry policy decides, not the worker's breaker. Pass when
// the failures do not persist, or ctx ends before the verdict.
func (g *Gate) Held(ctx context.Context) Verdict {
	job := jobOf(ctx)
	for judging := false; ; judging = true {
		g.mu.Lock()
		if g.b.state != Closed {
			g.mu.Unlock()
			return Hold
		}
		if !g.b.suspects(job) || ctx.Err() != nil {
			g.mu.Unlock()
			if judging && ctx.Err() == nil {
				return Own // judged (the suspicion was lifted) and not opened
			}
			return Pass
		}
		changed, probe := g.changed, !g.probing
		g.probing = true
		g.mu.Unlock()
		if probe {
			g.judge(ctx, job)
		} else if sleep(ctx, changed, -1) != nil {
			return Pass
		}
	}
}

// judge sends the probe for the suspect job and records its verdict.
func (g *Gate) judge(ctx context.Context, job string) {
	a := g.send(ctx)
	g.mu.Lock()
	defer g.mu.Unlock()
	g.probing = false
	gaveUp := ctx.Err() != nil
	switch {
	case g.b.judged(g.cfg.now(), a, gaveUp):
		g.verdict(false)
		g.changedTo(false)
	case !gaveUp && !a.failed && g.b.state == Closed:
		g.verdict(true)
		g.cfg.Logger.Info("model endpoint answers the probe; the failed requests were one job's own, its turn fails and no other job is held",
			"job_id", job)
	}
	g.wake()
}

// verdict reports a probe's verdict on a suspect's failures; the lock is held.
func (g *Gate) verdict(own bool) {
	if g.cfg.OnVerdict != nil {
		g.cfg.OnVerdict(own)
	}
}

// probe sends the probe and records its answer.
func (g *Gate) probe(ctx context.Context) {
	a := g.send(ctx)
	g.mu.Lock()
	defer g.mu.Unlock()
	g.probing = false
	gaveUp := ctx.Err() != nil
	if g.b.probed(g.cfg.now(), a, gaveUp) {
		g.changedTo(true)
	} else if !gaveUp {
		g.cfg.Logger.Debug("model endpoint probe failed", "error", a.why, "next_probe_in", g.b.probeAt.Sub(g.cfg.now()).Round(time.Millisecond).String())
	}
	g.wake()
}

// send sends one probe and returns its answer.
func (g *Gate) send(ctx context.Context) answer {
	pctx, cancel := context.WithTimeout(ctx, g.cfg.ProbeTimeout)
	defer cancel()
	resp, err := g.cfg.Probe(pctx)
	a := classify(pctx, resp, err)
	if resp != nil && resp.Body != nil {
		// An answer is one whose body arrives, as for requests (Transport): a probe whose body
		// breaks off or stalls failed.
		if _, rerr := io.Copy(io.Discard, io.LimitReader(resp.Body, maxProbeBody)); rerr != nil && !a.failed {
			a = brokenBody(pctx, rerr)
		}
		resp.Body.Close()
	}
	return a
}

// observe records the answer of a request job sent that passed the gate.
func (g *Gate) observe(a answer, job string) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.b.record(g.cfg.now(), a, job) {
		g.changedTo(g.b.state == Closed)
		g.wake()
	}
}

// changedTo logs and reports a change of the breaker; the lock is held.
func (g *Gate) changedTo(up bool) {
	now := g.cfg.now()
	if up {
		g.cfg.Logger.Info("model endpoint answers again; releasing held requests", "down_ms", now.Sub(g.b.downSince).Milliseconds())
	} else {
		g.cfg.Logger.Warn("model endpoint down; holding model requests and new jobs until a probe is answered",
			"error", g.b.why, "failures", g.b.failures, "next_probe_in", g.b.probeAt.Sub(now).Round(time.Millisecond).String())
	}
	if g.cfg.OnChange != nil {
		g.cfg.OnChange(up)
	}
}

// wake lets every waiter look at the state again; the lock is held.
func (g *Gate) wake() {
	close(g.changed)
	g.changed = make(chan struct{})
}
