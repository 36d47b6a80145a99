//go:build integration

package e2e

import (
	"fmt"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/boxcar-run/boxcar/test/testworker"
)

// TestWorkersWithDifferentTenants: two workers on one NATS whose tenants: give team-a
// different max_concurrent values. The second does not change team-a's consumer, which keeps
// the first's bound; it logs a warning naming the tenant, both values and what to do, and its
// /metrics says boxcar_tenant_config_mismatch 1 for team-a (0 for team-b, on which they agree),
// while the first worker's says 0 for both.
func TestWorkersWithDifferentTenants(t *testing.T) {
	t.Parallel()
	ns := startNATS(t)
	tenants := func(teamA int) string {
		return fmt.Sprintf("tenants:\n  team-a: {profiles: [csv-analyst], max_concurrent: %d}\n  team-b: {profiles: [csv-analyst], max_concurrent: 2}\n", teamA)
	}
	first := testworker.Start(t, testworker.Config{NATS: ns.ClientURL(), YAML: tenants(4)})
	second := testworker.Start(t, testworker.Config{NATS: ns.ClientURL(), YAML: tenants(8)})

	js, err := jetstream.New(natsConn(t, ns.ClientURL()))
	if err != nil {
		t.Fatal(err)
	}
	c, err := js.Consumer(t.Context(), "BOXCAR_JOBS_team-a", "boxcar-workers-team-a")
	if err != nil {
		t.Fatal(err)
	}
	if got := c.CachedInfo().Config.MaxAckPending; got != 4 {
		t.Errorf("team-a's consumer has max_ack_pending %d after the second worker started, want the first's 4", got)
	}

	warning := regexp.MustCompile(`"level":"WARN","msg":"[^"]*Every worker must have the same tenants:[^"]*worker setup[^"]*",.*"tenant":"team-a","consumer":"boxcar-workers-team-a","server_max_concurrent":4,"config_max_concurrent":8`)
	if n := second.Log.Count(warning); n != 1 {
		t.Errorf("the second worker warned %d times about team-a's max_concurrent, want once:\n%s", n, second.Log.String())
	}
	if n := first.Log.Count(regexp.MustCompile(`"server_max_concurrent"`)); n != 0 {
		t.Errorf("the first worker, whose tenants: the server has, warned about them:\n%s", first.Log.String())
	}

	for _, w := range []struct {
		name   string
		worker *testworker.Worker
		teamA  int
		teamB  int
	}{{"first", first, 0, 0}, {"second", second, 1, 0}} {
		scrape := waitHTTP(t, w.worker.MetricsURL(t)+"/metrics", 200, 30*time.Second, w.worker.Alive)
		for tenant, want := range map[string]int{"team-a": w.teamA, "team-b": w.teamB} {
			line := fmt.Sprintf("\nboxcar_tenant_config_mismatch{tenant=%q} %d\n", tenant, want)
			if !strings.Contains(scrape, line) {
				t.Errorf("the %s worker's /metrics lacks %q", w.name, strings.TrimSpace(line))
			}
		}
	}
}
