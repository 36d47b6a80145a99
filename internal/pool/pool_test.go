package pool_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"go.uber.org/goleak"

	"github.com/boxcar-run/boxcar/internal/config"
	"github.com/boxcar-run/boxcar/internal/pool"
	"github.com/boxcar-run/boxcar/internal/sandbox"
	"github.com/boxcar-run/boxcar/internal/spawn"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m, goleak.IgnoreAnyFunction(spawn.StarterFunc)) }

// fakeSandbox is a started sandbox that remembers its claim and its close.
type fakeSandbox struct {
	sandbox.Sandbox // nil: only the methods below are called
	id              string
	pool            string
	b               *fakeBackend
	claimErr        error

	mu         sync.Mutex
	tenant     string
	jobID      string
	closed     bool
	claimed    bool
	closeFails int           // closes still to fail
	closeGate  chan struct{} // held open: Close waits for it
}

func (s *fakeSandbox) Info() sandbox.Info { return sandbox.Info{Backend: "fake", ID: s.id} }

func (s *fakeSandbox) Claim(_ context.Context, tenant, jobID string) error {
	s.b.mu.Lock()
	hook := s.b.claimHook
	s.b.mu.Unlock()
	if hook != nil {
		hook()
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.claimErr != nil {
		return s.claimErr
	}
	s.tenant, s.jobID, s.claimed = tenant, jobID, true
	return nil
}

// Warm counts the call and returns the backend's warm gate: closed (done at once) unless the
// test holds it.
func (s *fakeSandbox) Warm() <-chan struct{} {
	s.b.mu.Lock()
	defer s.b.mu.Unlock()
	s.b.warmed++
	if s.b.warmGate != nil {
		return s.b.warmGate
	}
	done := make(chan struct{})
	close(done)
	return done
}

func (s *fakeSandbox) Close(context.Context) error {
	if s.closeGate != nil {
		<-s.closeGate
	}
	s.mu.Lock()
	if s.closeFails > 0 {
		s.closeFails--
		s.mu.Unlock()
		return errors.New("fake: the backend did not answer")
	}
	s.closed = true
	s.mu.Unlock()
	s.b.mu.Lock()
	s.b.live--
	s.b.mu.Unlock()
	return nil
}

// fakeBackend starts fakeSandboxes at once, or fails, or holds starts until released.
type fakeBackend struct {
	mu        sync.Mutex
	n, live   int
	peak      int
	failNext  int    // starts still to fail
	claimErr  error  // given to the next sandboxes
	claimHook func() // runs at each claim, before it answers
	gate      chan struct{}
	atGate    int           // starts that found the gate shut and wait at it
	warmGate  chan struct{} // held open: the sandboxes' warm-up does not end
	closeGate chan struct{} // given to the next sandboxes
	warmed    int           // Warm calls
	started   []*fakeSandbox
}

func (b *fakeBackend) Backend() string { return "fake" }

func (b *fakeBackend) Start(ctx context.Context, spec sandbox.Spec) (sandbox.Sandbox, error) {
	b.mu.Lock()
	gate := b.gate
	if gate != nil {
		b.atGate++
	}
	b.mu.Unlock()
	if gate != nil {
		select {
		case <-gate:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.failNext > 0 {
		b.failNext--
		return nil, errors.New("fake: start failed")
	}
	b.n++
	b.live++
	b.peak = max(b.peak, b.live)
	s := &fakeSandbox{id: fmt.Sprintf("sb-%d", b.n), pool: spec.Pool, b: b, claimErr: b.claimErr, closeGate: b.closeGate}
	b.started = append(b.started, s)
	return s, nil
}

func (b *fakeBackend) counts() (live, peak int) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.live, b.peak
}

// fakeLag is the queue's lag by tenant, set by the test.
type fakeLag struct {
	mu    sync.Mutex
	lag   map[string]pool.Lag
	err   error
	reads int
}

// set is the tenant's lag; the tests that do not name tenants use the profile's name.
func (l *fakeLag) set(tenant string, pending uint64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.lag[tenant] = pool.Lag{Tenant: tenant, Pending: pending}
}

func (l *fakeLag) Lags(context.Context) ([]pool.Lag, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.reads++
	if l.err != nil {
		return nil, l.err
	}
	return slices.Collect(maps.Values(l.lag)), nil
}

func (l *fakeLag) readCount() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.reads
}

// clock is a fake clock the test moves.
type clock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *clock) advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
}

type bundle struct {
	p     *pool.Pool
	b     *fakeBackend
	lag   *fakeLag
	clock *clock
	m     *pool.Metrics
}

func warmProfile(w config.Warm) config.Profile {
	if w.Idle == 0 {
		w.Idle = config.Duration(time.Minute)
	}
	if w.MaxAge == 0 {
		w.MaxAge = config.Duration(10 * time.Minute)
	}
	return config.Profile{Warm: &w}.WithDefaults()
}

func setup(t *testing.T, slots int, profiles map[string]config.Profile) *bundle {
	t.Helper()
	return setupTenants(t, slots, profiles, nil)
}

// setupTenants is setup with the worker's tenants (nil: every tenant is granted every profile).
func setupTenants(t *testing.T, slots int, profiles map[string]config.Profile, tenants map[string]config.Tenant) *bundle {
	t.Helper()
	lag := &fakeLag{lag: map[string]pool.Lag{}}
	bn := setupLag(t, slots, profiles, tenants, lag)
	bn.lag = lag
	return bn
}

// setupLag is setupTenants reading the lag from src.
func setupLag(t *testing.T, slots int, profiles map[string]config.Profile, tenants map[string]config.Tenant, src pool.LagSource) *bundle {
	t.Helper()
	bn := &bundle{b: &fakeBackend{}, clock: &clock{now: time.Unix(1_000_000, 0)}, m: pool.NewMetrics(nil)}
	p, err := pool.New(pool.Config{
		Provider: bn.b, Profiles: profiles, Slots: slots, Lag: src, Tenants: tenants, Metrics: bn.m,
		Logger: slog.New(slog.DiscardHandler), Now: bn.clock.Now,
	})
	if err != nil {
		t.Fatal(err)
	}
	bn.p = p
	return bn
}

// reconcile runs one round and waits for what it began.
func (bn *bundle) reconcile(t *testing.T) {
	t.Helper()
	bn.p.Reconcile(context.Background())
	bn.p.Settle()
}

func (bn *bundle) size(profile string) int {
	return int(testutil.ToFloat64(bn.m.Size.WithLabelValues(profile)))
}

func (bn *bundle) take(t *testing.T, profile, jobID string) (sandbox.Sandbox, bool) {
	t.Helper()
	return bn.takeAs(t, "t", profile, jobID)
}

func (bn *bundle) takeAs(t *testing.T, tenant, profile, jobID string) (sandbox.Sandbox, bool) {
	t.Helper()
	sb, warm, err := bn.p.Take(context.Background(), tenant, profile, jobID, sandbox.Spec{JobID: jobID})
	if err != nil {
		t.Fatalf("take %s: %v", jobID, err)
	}
	return sb, warm
}

func closeAll(t *testing.T, sbs ...sandbox.Sandbox) {
	t.Helper()
	for _, sb := range sbs {
		if err := sb.Close(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
}

func (b *fakeBackend) warmedCount() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.warmed
}
