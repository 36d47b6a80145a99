package helm

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"sigs.k8s.io/yaml"

	"github.com/boxcar-run/boxcar/internal/metrics"
	"github.com/boxcar-run/boxcar/internal/workercmd"
)

// exportedNames are the metric names the worker exports, read from the collectors it makes
// (workercmd.NewCollectors: its own, the warm pool's, the egress proxies'): what their registry
// gathers plus what every collector of each describes (vectors without a series yet gather
// nothing).
func exportedNames(t *testing.T) map[string]bool {
	t.Helper()
	c := workercmd.NewCollectors()
	c.Worker.WatchQueue(context.Background(), func(context.Context) ([]metrics.TenantLag, error) {
		return []metrics.TenantLag{{Tenant: "default"}}, nil
	})
	names := map[string]bool{}
	families, err := c.Worker.Registry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range families {
		names[f.GetName()] = true
	}
	fqName := regexp.MustCompile(`fqName: "([^"]+)"`)
	sets := reflect.ValueOf(c)
	for i := range sets.NumField() {
		v := sets.Field(i).Elem()
		for j := range v.NumField() {
			if !v.Type().Field(j).IsExported() {
				continue
			}
			col, ok := v.Field(j).Interface().(prometheus.Collector)
			if !ok {
				continue
			}
			ch := make(chan *prometheus.Desc, 8)
			col.Describe(ch)
			close(ch)
			for d := range ch {
				if m := fqName.FindStringSubmatch(d.String()); m != nil {
					names[m[1]] = true
				}
			}
		}
	}
	return names
}

var boxcarMetric = regexp.MustCompile(`\bboxcar_[a-z0-9_]+`)

// pendingMetrics are metrics the chart already uses that the worker is about to export
// (issue 27's model circuit breaker adds boxcar_model_up): they may be missing from the
// registry, and once exported they are held to it like any other.
var pendingMetrics = map[string]bool{"boxcar_model_up": true}

// checkMetricNames fails for every boxcar_ name in expr that the worker does not export, and
// returns the names it found (histogram series suffixes removed).
func checkMetricNames(t *testing.T, where, expr string, exported map[string]bool) []string {
	t.Helper()
	var found []string
	for _, name := range boxcarMetric.FindAllString(expr, -1) {
		base := name
		for _, suffix := range []string{"_bucket", "_count", "_sum"} {
			if b, ok := strings.CutSuffix(name, suffix); ok && exported[b] {
				base = b
			}
		}
		if !exported[base] && !pendingMetrics[base] {
			t.Errorf("%s: %s is not a metric the worker exports", where, name)
		}
		found = append(found, base)
	}
	return found
}

var wantAlerts = []string{"BoxcarDeadLetters", "BoxcarJobFailureRatio", "BoxcarModelDown", "BoxcarNoProgress", "BoxcarNoWorkers", "BoxcarSandboxStartFailures"}

// checkRules holds the PrometheusRule to the alerts the issue names, to metrics the worker
// exports, and to what promtool accepts.
func checkRules(t *testing.T, pr *prometheusRule) {
	t.Helper()
	exported := exportedNames(t)
	var alerts []string
	for _, g := range pr.Spec.Groups {
		for _, r := range g.Rules {
			alerts = append(alerts, r.Alert)
			checkMetricNames(t, "alert "+r.Alert, r.Expr, exported)
			if r.Labels["severity"] == "" || r.Annotations["summary"] == "" || r.Annotations["description"] == "" {
				t.Errorf("alert %s lacks a severity, summary or description", r.Alert)
			}
			checkRunbook(t, r.Alert, r.Annotations["runbook_url"])
		}
	}
	slices.Sort(alerts)
	if !slices.Equal(alerts, wantAlerts) {
		t.Errorf("alerts %v, want %v", alerts, wantAlerts)
	}
	file := writeRules(t, pr, true)
	promtoolCheckRules(t, file)
}

// checkRunbook: an alert's runbook_url points at a section of docs/operations.md that exists,
// named after the alert, as GitHub anchors its heading.
func checkRunbook(t *testing.T, alert, link string) {
	t.Helper()
	base, anchor, ok := strings.Cut(link, "#")
	if !ok || !strings.HasSuffix(base, "/docs/operations.md") || anchor != strings.ToLower(alert) {
		t.Errorf("alert %s: runbook_url %q, want .../docs/operations.md#%s", alert, link, strings.ToLower(alert))
		return
	}
	doc, err := os.ReadFile(filepath.Join("..", "..", "docs", "operations.md"))
	if err != nil {
		t.Fatal(err)
	}
	for line := range strings.Lines(string(doc)) {
		if h, ok := strings.CutPrefix(strings.TrimSpace(line), "### "); ok && strings.ToLower(strings.TrimSpace(h)) == anchor {
			return
		}
	}
	t.Errorf("alert %s: docs/operations.md has no section \"### %s\" for its runbook_url", alert, alert)
}

// writeRules writes the PrometheusRule's groups as a Prometheus rule file.
func writeRules(t *testing.T, pr *prometheusRule, annotations bool) string {
	t.Helper()
	groups := slices.Clone(pr.Spec.Groups)
	if !annotations {
		// Unit tests compare annotations whole; they test the expressions, not the prose.
		for i := range groups {
			rules := slices.Clone(groups[i].Rules)
			for j := range rules {
				rules[j].Annotations = nil
			}
			groups[i].Rules = rules
		}
	}
	data, err := yaml.Marshal(map[string]any{"groups": groups})
	if err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(t.TempDir(), "boxcar-rules.yaml")
	if err := os.WriteFile(file, data, 0o644); err != nil {
		t.Fatal(err)
	}
	return file
}

// checkDashboard holds the Grafana dashboard to valid JSON, to metrics the worker exports, and
// to showing every Boxcar metric.
func checkDashboard(t *testing.T, data []byte) {
	t.Helper()
	var dash struct {
		Title  string `json:"title"`
		UID    string `json:"uid"`
		Panels []struct {
			Title   string `json:"title"`
			Type    string `json:"type"`
			GridPos struct {
				Y int `json:"y"`
			} `json:"gridPos"`
			Targets []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
		Templating struct {
			List []struct {
				Name string `json:"name"`
			} `json:"list"`
		} `json:"templating"`
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	if err := dec.Decode(&dash); err != nil {
		t.Fatalf("dashboard is not JSON: %v", err)
	}
	if dash.Title == "" || dash.UID == "" || len(dash.Panels) == 0 {
		t.Fatalf("dashboard %q (uid %q) with %d panels", dash.Title, dash.UID, len(dash.Panels))
	}
	exported := exportedNames(t)
	shown := map[string]bool{}
	var vars []string
	for _, v := range dash.Templating.List {
		vars = append(vars, v.Name)
	}
	var panels []dashPanel
	for _, p := range dash.Panels {
		dp := dashPanel{title: p.Title, typ: p.Type, y: p.GridPos.Y}
		for _, target := range p.Targets {
			dp.exprs = append(dp.exprs, target.Expr)
		}
		panels = append(panels, dp)
	}
	checkDashboardLayout(t, vars, panels)
	for _, p := range dash.Panels {
		if len(p.Targets) == 0 {
			t.Errorf("panel %q has no query", p.Title)
		}
		for _, target := range p.Targets {
			for _, name := range checkMetricNames(t, "panel "+p.Title, target.Expr, exported) {
				shown[name] = true
			}
		}
	}
	for name := range exported {
		if strings.HasPrefix(name, "boxcar_") && !shown[name] {
			t.Errorf("the dashboard does not show %s", name)
		}
	}
}

// profileMetrics are the metrics with a profile label: the dashboard's profile variable filters
// every query of them.
var profileMetrics = regexp.MustCompile(`\b(boxcar_jobs_total|boxcar_job_duration_seconds(_bucket|_count|_sum)?|boxcar_job_queue_wait_seconds(_bucket|_count|_sum)?|boxcar_tool_calls_total|boxcar_model_tokens_total|boxcar_cap_hits_total|boxcar_pool_[a-z_]+)\{([^}]*)\}`)

// dashPanel is what checkDashboardLayout reads of a panel.
type dashPanel struct {
	title, typ string
	y          int
	exprs      []string
}

// checkDashboardLayout (issue 27): a row of stat panels on top, a profile variable that every
// query of a metric with a profile label follows, and token and cost panels.
func checkDashboardLayout(t *testing.T, vars []string, panels []dashPanel) {
	t.Helper()
	for _, want := range []string{"namespace", "profile", "prompt_price", "completion_price"} {
		if !slices.Contains(vars, want) {
			t.Errorf("the dashboard has no variable %s", want)
		}
	}
	stats, tokens, cost := 0, false, false
	for _, p := range panels {
		if p.typ == "stat" && p.y == 0 {
			stats++
		}
		for _, e := range p.exprs {
			for _, m := range profileMetrics.FindAllStringSubmatch(e, -1) {
				if !strings.Contains(m[4], `profile=~"$profile"`) {
					t.Errorf("panel %q: %s is not filtered by the profile variable", p.title, m[0])
				}
			}
			tokens = tokens || strings.Contains(e, "boxcar_model_tokens_total")
			cost = cost || strings.Contains(e, "$prompt_price") && strings.Contains(e, "$completion_price")
		}
	}
	if stats < 4 || !tokens || !cost {
		t.Errorf("the dashboard has %d stat panels on top (want a row, at least 4), token panels %v, cost panels %v", stats, tokens, cost)
	}
}

// TestDashboardFile checks the dashboard as shipped in the chart, also when the ConfigMap is off.
func TestDashboardFile(t *testing.T) {
	data, err := os.ReadFile(filepath.Join(chartDir, "dashboards", "boxcar.json"))
	if err != nil {
		t.Fatal(err)
	}
	checkDashboard(t, data)
}
