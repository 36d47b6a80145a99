package pool_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
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
	deaf      bool          // starts at the gate do not hear their context's end: called back, they come all the same
	warmGate  chan struct{} // held open: the sandboxes' warm-up does not end
	closeGate chan struct{} // given to the next sandboxes
	warmed    int           // Warm calls
	started   []*fakeSandbox
}

func (b *fakeBackend) Backend() string { return "fake" }

func (b *fakeBackend) Start(ctx context.Context, spec sandbox.Spec) (sandbox.Sandbox, error) {
	b.mu.Lock()
	gate, done := b.gate, ctx.Done()
	if gate != nil {
		b.atGate++
	}
	if b.deaf {
		done = nil
	}
	b.mu.Unlock()
	if gate != nil {
		select {
		case <-gate:
		case <-done:
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

// TestEveryRemovalIsCounted: every warm sandbox that leaves the pool without serving a job is
// counted once in boxcar_pool_removed_total, under the reason of the path that let it go, and
// a warm start that failed under start_failed. Only aged and claim_failed were: a pool shrunk
// to its target, a sandbox let go for a job's cold start, one whose claim the job's end cut
// short, one a called-back start brought all the same, and those the pool's close removed
// were in no reason, and the rate of removals on the dashboard missed them.
func TestEveryRemovalIsCounted(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		reason string
		want   float64
		run    func(t *testing.T, bn *bundle)
	}{
		{reason: "aged", want: 1, run: func(t *testing.T, bn *bundle) {
			bn.reconcile(t)
			bn.clock.advance(11 * time.Minute) // past max_age
			bn.reconcile(t)
		}},
		{reason: "claim_failed", want: 1, run: func(t *testing.T, bn *bundle) {
			bn.b.claimErr = errors.New("fake: the pod may not be patched")
			bn.reconcile(t)
			sb, _ := bn.take(t, "p", "job-1")
			closeAll(t, sb)
		}},
		{reason: "claim_cut_short", want: 1, run: func(t *testing.T, bn *bundle) {
			bn.reconcile(t)
			ctx, cancel := context.WithCancel(t.Context())
			bn.b.mu.Lock()
			bn.b.started[0].claimErr = context.Canceled
			bn.b.claimHook = cancel // the job ends while its claim is under way
			bn.b.mu.Unlock()
			if _, _, err := bn.p.Take(ctx, "t", "p", "job-1", sandbox.Spec{}); err == nil {
				t.Fatal("take whose claim was cut short succeeded")
			}
		}},
		{reason: "over_target", want: 1, run: func(t *testing.T, bn *bundle) {
			bn.lag.set("p", 2)
			bn.reconcile(t)
			bn.lag.set("p", 0)
			bn.clock.advance(2 * time.Minute) // past idle
			bn.reconcile(t)
		}},
		{reason: "over_target", want: 1, run: func(t *testing.T, bn *bundle) { // a start called back comes all the same
			bn.b.mu.Lock()
			bn.b.gate, bn.b.deaf = make(chan struct{}), true
			bn.b.mu.Unlock()
			bn.lag.set("p", 2)
			bn.p.Reconcile(t.Context())
			bn.lag.set("p", 0)
			bn.clock.advance(2 * time.Minute)
			bn.p.Reconcile(t.Context())
			bn.b.mu.Lock()
			close(bn.b.gate)
			bn.b.mu.Unlock()
			bn.p.Settle()
		}},
		{reason: "cold_start", want: 1, run: func(t *testing.T, bn *bundle) {
			bn.reconcile(t)
			bn.reconcile(t) // Min 1 and lag 1: both of the 2 slots warm
			sbs := []sandbox.Sandbox{}
			for _, job := range []string{"job-1", "job-2"} {
				sb, _ := bn.take(t, "cold", job)
				sbs = append(sbs, sb)
			}
			closeAll(t, sbs...)
		}},
		{reason: "closed", want: 1, run: func(t *testing.T, bn *bundle) {
			bn.reconcile(t)
		}},
		{reason: "start_failed", want: 1, run: func(t *testing.T, bn *bundle) {
			bn.b.failNext = 1
			bn.reconcile(t)
			bn.clock.advance(time.Minute) // past the backoff
			bn.reconcile(t)
		}},
	} {
		t.Run(tt.reason, func(t *testing.T) {
			t.Parallel()
			bn := setup(t, 2, map[string]config.Profile{"p": warmProfile(config.Warm{Min: 1, Max: 2}), "cold": config.Profile{}.WithDefaults()})
			if tt.reason == "cold_start" {
				bn.lag.set("p", 2)
			}
			tt.run(t, bn)
			bn.p.Close()
			if got := testutil.ToFloat64(bn.m.Replaced.WithLabelValues("p", tt.reason)); got < tt.want {
				t.Errorf("boxcar_pool_removed_total{reason=%q} %v, want at least %v", tt.reason, got, tt.want)
			}
			bn.b.mu.Lock()
			unused := 0
			for _, s := range bn.b.started {
				if s.pool != "" && !s.claimed {
					unused++
				}
			}
			bn.b.mu.Unlock()
			counted := 0.0
			for _, reason := range pool.RemovalReasons() {
				if reason != "start_failed" {
					counted += testutil.ToFloat64(bn.m.Replaced.WithLabelValues("p", reason))
				}
			}
			if counted != float64(unused) {
				t.Errorf("boxcar_pool_removed_total counts %v warm sandboxes removed, %d served no job", counted, unused)
			}
		})
	}
}

// TestRemovalReasonsDocumented: docs/operations.md's row of boxcar_pool_removed_total names
// every reason the pool counts under.
func TestRemovalReasonsDocumented(t *testing.T) {
	t.Parallel()
	doc, err := os.ReadFile(filepath.Join("..", "..", "docs", "operations.md"))
	if err != nil {
		t.Fatal(err)
	}
	_, row, _ := strings.Cut(string(doc), "| `boxcar_pool_removed_total` |")
	row, _, _ = strings.Cut(row, "\n")
	for _, reason := range pool.RemovalReasons() {
		if !strings.Contains(row, "`"+reason+"`") {
			t.Errorf("docs/operations.md's boxcar_pool_removed_total row names no reason %q: %s", reason, row)
		}
	}
}
