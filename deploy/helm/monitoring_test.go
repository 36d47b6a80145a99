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
)

// exportedNames are the metric names the worker exports, read from the metrics package itself:
// what its registry gathers plus what every collector of Metrics describes (vectors without a
// series yet gather nothing).
func exportedNames(t *testing.T) map[string]bool {
	t.Helper()
	m := metrics.New()
	m.WatchQueue(context.Background(), func(context.Context) (uint64, uint64, error) { return 0, 0, nil })
	names := map[string]bool{}
	families, err := m.Registry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range families {
		names[f.GetName()] = true
	}
	fqName := regexp.MustCompile(`fqName: "([^"]+)"`)
	v := reflect.ValueOf(m).Elem()
	for i := range v.NumField() {
		if !v.Type().Field(i).IsExported() {
			continue
		}
		c, ok := v.Field(i).Interface().(prometheus.Collector)
		if !ok {
			continue
		}
		ch := make(chan *prometheus.Desc, 8)
		c.Describe(ch)
		close(ch)
		for d := range ch {
			if m := fqName.FindStringSubmatch(d.String()); m != nil {
				names[m[1]] = true
			}
		}
	}
	return names
}

var boxcarMetric = regexp.MustCompile(`\bboxcar_[a-z0-9_]+`)

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
		if !exported[base] {
			t.Errorf("%s: %s is not a metric the worker exports", where, name)
		}
		found = append(found, base)
	}
	return found
}

var wantAlerts = []string{"BoxcarDeadLetters", "BoxcarJobFailureRatio", "BoxcarNoProgress", "BoxcarNoWorkers", "BoxcarSandboxStartFailures"}

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
		}
	}
	slices.Sort(alerts)
	if !slices.Equal(alerts, wantAlerts) {
		t.Errorf("alerts %v, want %v", alerts, wantAlerts)
	}
	file := writeRules(t, pr, true)
	promtoolCheckRules(t, file)
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
			Targets []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
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

// TestDashboardFile checks the dashboard as shipped in the chart, also when the ConfigMap is off.
func TestDashboardFile(t *testing.T) {
	data, err := os.ReadFile(filepath.Join(chartDir, "dashboards", "boxcar.json"))
	if err != nil {
		t.Fatal(err)
	}
	checkDashboard(t, data)
}
