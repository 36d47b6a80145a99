package workercmd

import (
	"context"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/boxcar-run/boxcar/internal/config"
	"github.com/boxcar-run/boxcar/internal/metrics"
	"github.com/boxcar-run/boxcar/internal/pool"
	"github.com/boxcar-run/boxcar/internal/sandbox"
)

// TestPoolWarmsOnlyWhatTheTenantsMayRun: the worker's pool counts a tenant's lag towards the
// profiles its tenants: section grants it, not towards every warm profile.
func TestPoolWarmsOnlyWhatTheTenantsMayRun(t *testing.T) {
	warm := config.Profile{Warm: &config.Warm{Idle: config.Duration(time.Minute), MaxAge: config.Duration(time.Hour)}}.WithDefaults()
	starts := &countStarts{byPool: map[string]int{}}
	p := &parts{
		cfg: config.Config{Concurrency: 8,
			Profiles: map[string]config.Profile{"a": warm, "b": warm},
			Tenants:  map[string]config.Tenant{"one": {Profiles: []string{"a"}}, "two": {Profiles: []string{"b"}}}},
		log: slog.New(slog.DiscardHandler), sandboxes: starts, metrics: metrics.New(),
	}
	pl, err := newPool(p, lagOf{{Tenant: "one", Pending: 3}})
	if err != nil {
		t.Fatal(err)
	}
	pl.Reconcile(context.Background())
	pl.Close() // waits for the starts the round began
	starts.mu.Lock()
	defer starts.mu.Unlock()
	if a, b := starts.byPool["a"], starts.byPool["b"]; a != 3 || b != 0 {
		t.Errorf("sandboxes started ahead: a %d, b %d; want 3 for tenant one's lag, and none of b, which only tenant two may run", a, b)
	}
}

// lagOf is a queue whose lag is fixed.
type lagOf []pool.Lag

func (l lagOf) Lags(context.Context) ([]pool.Lag, error) { return l, nil }

// countStarts starts sandboxes that do nothing, counted by the pool they are started for.
type countStarts struct {
	mu     sync.Mutex
	byPool map[string]int
}

func (c *countStarts) Backend() string { return "count" }

func (c *countStarts) Start(_ context.Context, spec sandbox.Spec) (sandbox.Sandbox, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.byPool[spec.Pool]++
	return idleSandbox{}, nil
}

// idleSandbox is a started sandbox the pool only closes.
type idleSandbox struct{ sandbox.Sandbox }

func (idleSandbox) Info() sandbox.Info          { return sandbox.Info{Backend: "count"} }
func (idleSandbox) Close(context.Context) error { return nil }
