package queue_test

import (
	"bytes"
	"context"
	"encoding/json"
	"log/slog"
	"strings"
	"testing"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/boxcar-run/boxcar/internal/config"
	"github.com/boxcar-run/boxcar/internal/queue"
	"github.com/boxcar-run/boxcar/test/harness"
)

// TestWorkersWhoseTenantsDiffer: two workers whose tenants: give a tenant different
// max_concurrent values do not flip its consumer at each start. The consumer keeps the bound
// it was declared with; the worker that disagrees says so (the tenant, both values, what to
// do) and reports it in its lag, the first worker does not; a restart changes nothing; and
// `worker setup` with the second's config sets the server's, after which the roles swap.
func TestWorkersWhoseTenantsDiffer(t *testing.T) {
	t.Parallel()
	nc := connect(t, false)
	js := jetStream(t, nc)
	cfg := config.Config{}.WithDefaults().NATS
	tenants := func(teamA int) map[string]config.Tenant {
		return map[string]config.Tenant{"team-a": {Profiles: []string{"p"}, MaxConcurrent: teamA}, "team-b": {Profiles: []string{"p"}, MaxConcurrent: 2}}
	}
	first, second := tenants(4), tenants(8)
	var log1, log2 harness.LogBuffer
	w1 := openLogged(t, nc, cfg, first, &log1)
	w2 := openLogged(t, nc, cfg, second, &log2)

	checkBound(t, js, "after a second worker with another max_concurrent started", 4)
	if got := mismatches(&log2); len(got) != 1 || got[0].Tenant != "team-a" || got[0].Server != 4 || got[0].Config != 8 ||
		!strings.Contains(got[0].Msg, "Every worker must have the same tenants:") || !strings.Contains(got[0].Msg, "worker setup") {
		t.Errorf("the second worker's warnings: %+v; want one naming team-a, the server's 4 and its own 8, and what to do", got)
	}
	if got := mismatches(&log1); len(got) != 0 {
		t.Errorf("the first worker warned %+v, want nothing: its config is the server's", got)
	}
	checkMismatch(t, "first worker", w1, map[string]bool{"team-a": false, "team-b": false})
	checkMismatch(t, "second worker", w2, map[string]bool{"team-a": true, "team-b": false})

	// The first worker starts again: nothing changes.
	w1 = openLogged(t, nc, cfg, first, &log1)
	checkBound(t, js, "after the first worker started again", 4)

	// The operator runs `worker setup` with the second's config: the server takes it.
	admin, err := queue.NewAdmin(nc, cfg, second, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	if err := admin.Declare(t.Context()); err != nil {
		t.Fatal(err)
	}
	checkBound(t, js, "after worker setup with the second worker's config", 8)
	checkMismatch(t, "first worker", w1, map[string]bool{"team-a": true, "team-b": false})
	checkMismatch(t, "second worker", w2, map[string]bool{"team-a": false, "team-b": false})
	if got := mismatches(&log1); len(got) != 1 || got[0].Server != 8 || got[0].Config != 4 {
		t.Errorf("the first worker's warnings after setup: %+v; want one naming the server's 8 and its own 4", got)
	}
}

// openLogged starts a worker's consumer for tenants, logging as JSON to log.
func openLogged(t *testing.T, nc *nats.Conn, cfg config.NATS, tenants map[string]config.Tenant, log *harness.LogBuffer) *queue.Consumer {
	t.Helper()
	w, err := queue.Open(t.Context(), nc, cfg, tenants, slog.New(slog.NewJSONHandler(log, nil)))
	if err != nil {
		t.Fatalf("open a consumer: %v", err)
	}
	return w
}

// checkBound fails the test unless team-a's consumer has max_ack_pending want.
func checkBound(t *testing.T, js jetstream.JetStream, when string, want int) {
	t.Helper()
	c, err := js.Consumer(t.Context(), "BOXCAR_JOBS_team-a", "boxcar-workers-team-a")
	if err != nil {
		t.Fatal(err)
	}
	if got := c.CachedInfo().Config.MaxAckPending; got != want {
		t.Errorf("%s, team-a's consumer has max_ack_pending %d, want %d", when, got, want)
	}
}

// checkMismatch fails the test unless w's lag reports a config mismatch for the tenants of want
// that are true, and none for the others.
func checkMismatch(t *testing.T, who string, w *queue.Consumer, want map[string]bool) {
	t.Helper()
	lags, err := w.ConsumerLag(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]bool{}
	for _, l := range lags {
		got[l.Tenant] = l.ConfigMismatch
	}
	for tenant, mismatch := range want {
		if got[tenant] != mismatch {
			t.Errorf("%s: tenant %s config mismatch %v, want %v", who, tenant, got[tenant], mismatch)
		}
	}
}

// mismatch is a warning that a tenant's max_concurrent differs from the server's.
type mismatch struct {
	Level  string `json:"level"`
	Msg    string `json:"msg"`
	Tenant string `json:"tenant"`
	Server int    `json:"server_max_concurrent"`
	Config int    `json:"config_max_concurrent"`
}

// mismatches are the warnings log holds that a tenant's max_concurrent differs from the
// server's.
func mismatches(log *harness.LogBuffer) []mismatch {
	var out []mismatch
	for line := range bytes.Lines(log.Bytes()) {
		var m mismatch
		if json.Unmarshal(line, &m) == nil && m.Level == "WARN" && m.Config != 0 {
			out = append(out, m)
		}
	}
	return out
}
