package helm

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"os/exec"
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

// promtool finds promtool, or fails with how to install it.
func promtool(t *testing.T) string {
	t.Helper()
	p, err := exec.LookPath("promtool")
	if err != nil {
		t.Fatalf("promtool not found (it checks the alert rules): apt-get install -y prometheus")
	}
	return p
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
	out, err := exec.Command(promtool(t), "check", "rules", file).CombinedOutput()
	if err != nil {
		t.Errorf("promtool check rules: %v\n%s", err, out)
	}
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

// TestAlertRules runs promtool's rule unit tests on the rendered alerts: each fires on the
// series that should fire it, and stays quiet otherwise.
func TestAlertRules(t *testing.T) {
	r := render(t, values(t, "metrics: {prometheusRule: {enabled: true}}"))
	pr := all[*prometheusRule](r)
	if len(pr) != 1 {
		t.Fatalf("%d PrometheusRules, want 1", len(pr))
	}
	rules := writeRules(t, pr[0], false)
	// The labels a ServiceMonitor scrape of the release's metrics Service carries.
	const sel = `namespace="boxcar",service="boxcar-metrics",pod="boxcar-abc"`
	// The workers' consumer as the NATS chart's exporter (-prefix=nats -jsz=all) reports it from
	// the consumer's leader and a follower, and the Deployment as kube-state-metrics does.
	const (
		consumer = `account="$G",stream_name="BOXCAR_JOBS",consumer_name="boxcar-workers",namespace="nats",service="nats-headless"`
		leader   = consumer + `,server_name="nats-0",pod="nats-0",is_consumer_leader="true"`
		follower = consumer + `,server_name="nats-1",pod="nats-1",is_consumer_leader="false"`
		workers  = `kube_deployment_status_replicas_available{namespace="boxcar",deployment="boxcar",job="kube-state-metrics"}`
	)
	tests := `
rule_files: [` + rules + `]
evaluation_interval: 1m
tests:
  - name: dead letters
    interval: 1m
    input_series:
      - series: 'boxcar_dead_letters_total{` + sel + `,reason="input_missing"}'
        values: '0 0 0 1 1 1 1 1 1 1 1 1 1 1 1 1 1 1 1 1 1 1 1 1 1 1 1 1 1 1 1 1 1 1 1'
    alert_rule_test:
      - {eval_time: 2m, alertname: BoxcarDeadLetters, exp_alerts: []}
      - eval_time: 5m
        alertname: BoxcarDeadLetters
        exp_alerts: [{exp_labels: {severity: warning}}]
      - {eval_time: 30m, alertname: BoxcarDeadLetters, exp_alerts: []}

  - name: job failure ratio
    interval: 1m
    input_series:
      - {series: 'boxcar_jobs_total{` + sel + `,profile="p",outcome="succeeded"}', values: '0+1x60'}
      - {series: 'boxcar_jobs_total{` + sel + `,profile="p",outcome="failed"}', values: '0+1x60'}
      - {series: 'boxcar_jobs_total{` + sel + `,profile="q",outcome="succeeded"}', values: '0+10x60'}
    alert_rule_test:
      - eval_time: 50m
        alertname: BoxcarJobFailureRatio
        exp_alerts: []
  - name: job failure ratio high
    interval: 1m
    input_series:
      - {series: 'boxcar_jobs_total{` + sel + `,profile="p",outcome="succeeded"}', values: '0+1x60'}
      - {series: 'boxcar_jobs_total{` + sel + `,profile="p",outcome="dead"}', values: '0+1x60'}
    alert_rule_test:
      - {eval_time: 10m, alertname: BoxcarJobFailureRatio, exp_alerts: []}
      - eval_time: 50m
        alertname: BoxcarJobFailureRatio
        exp_alerts: [{exp_labels: {severity: warning}}]

  - name: backlog with no job finishing
    interval: 1m
    input_series:
      - {series: 'boxcar_queue_pending_jobs{` + sel + `}', values: '5x90'}
      - {series: 'boxcar_jobs_total{` + sel + `,profile="p",outcome="succeeded"}', values: '3x90'}
    alert_rule_test:
      - {eval_time: 5m, alertname: BoxcarNoProgress, exp_alerts: []}
      - eval_time: 45m
        alertname: BoxcarNoProgress
        exp_alerts: [{exp_labels: {severity: critical}}]
  - name: backlog and no job has ever finished
    interval: 1m
    input_series:
      - {series: 'boxcar_queue_pending_jobs{` + sel + `}', values: '5x90'}
    alert_rule_test:
      - eval_time: 45m
        alertname: BoxcarNoProgress
        exp_alerts: [{exp_labels: {severity: critical}}]
  - name: backlog being worked off
    interval: 1m
    input_series:
      - {series: 'boxcar_queue_pending_jobs{` + sel + `}', values: '50-1x50'}
      - {series: 'boxcar_jobs_total{` + sel + `,profile="p",outcome="succeeded"}', values: '0+1x50'}
    alert_rule_test:
      - {eval_time: 45m, alertname: BoxcarNoProgress, exp_alerts: []}
  - name: no backlog
    interval: 1m
    input_series:
      - {series: 'boxcar_queue_pending_jobs{` + sel + `}', values: '0x90'}
    alert_rule_test:
      - {eval_time: 45m, alertname: BoxcarNoProgress, exp_alerts: []}

  - name: jobs wait and no worker is available
    interval: 1m
    input_series:
      - {series: 'nats_consumer_num_pending{` + leader + `}', values: '0 0 5x30'}
      - {series: 'nats_consumer_num_ack_pending{` + leader + `}', values: '0x32'}
      - {series: '` + workers + `', values: '0x32'}
    alert_rule_test:
      - {eval_time: 4m, alertname: BoxcarNoWorkers, exp_alerts: []}
      - eval_time: 10m
        alertname: BoxcarNoWorkers
        exp_alerts: [{exp_labels: {severity: critical}}]
  - name: jobs delivered to workers that are gone
    interval: 1m
    input_series:
      - {series: 'nats_consumer_num_pending{` + leader + `}', values: '0x30'}
      - {series: 'nats_consumer_num_ack_pending{` + leader + `}', values: '2x30'}
      - {series: '` + workers + `', values: '0x30'}
    alert_rule_test:
      - eval_time: 10m
        alertname: BoxcarNoWorkers
        exp_alerts: [{exp_labels: {severity: critical}}]
  - name: jobs wait and workers run
    interval: 1m
    input_series:
      - {series: 'nats_consumer_num_pending{` + leader + `}', values: '40x30'}
      - {series: 'nats_consumer_num_ack_pending{` + leader + `}', values: '4x30'}
      - {series: '` + workers + `', values: '0 0 1 2x27'}
    alert_rule_test:
      - {eval_time: 20m, alertname: BoxcarNoWorkers, exp_alerts: []}
  - name: no workers and nothing waits; a follower's stale count is not the queue
    interval: 1m
    input_series:
      - {series: 'nats_consumer_num_pending{` + leader + `}', values: '0x30'}
      - {series: 'nats_consumer_num_ack_pending{` + leader + `}', values: '0x30'}
      - {series: 'nats_consumer_num_pending{` + follower + `}', values: '7x30'}
      - {series: 'nats_consumer_num_ack_pending{` + follower + `}', values: '0x30'}
      - {series: '` + workers + `', values: '0x30'}
    alert_rule_test:
      - {eval_time: 20m, alertname: BoxcarNoWorkers, exp_alerts: []}
  - name: another stream, another release's deployment
    interval: 1m
    input_series:
      - {series: 'nats_consumer_num_pending{account="$G",stream_name="OTHER",consumer_name="boxcar-workers",is_consumer_leader="true"}', values: '9x30'}
      - {series: 'nats_consumer_num_ack_pending{account="$G",stream_name="OTHER",consumer_name="boxcar-workers",is_consumer_leader="true"}', values: '0x30'}
      - {series: 'nats_consumer_num_pending{` + leader + `}', values: '0x30'}
      - {series: 'nats_consumer_num_ack_pending{` + leader + `}', values: '0x30'}
      - {series: 'kube_deployment_status_replicas_available{namespace="other",deployment="boxcar"}', values: '0x30'}
      - {series: '` + workers + `', values: '2x30'}
    alert_rule_test:
      - {eval_time: 20m, alertname: BoxcarNoWorkers, exp_alerts: []}

  - name: sandbox starts failing
    interval: 1m
    input_series:
      - {series: 'boxcar_sandbox_failures_total{` + sel + `,backend="kubernetes",stage="start"}', values: '0+1x60'}
      - {series: 'boxcar_sandbox_start_seconds_count{` + sel + `,backend="kubernetes"}', values: '0+1x60'}
    alert_rule_test:
      - eval_time: 30m
        alertname: BoxcarSandboxStartFailures
        exp_alerts: [{exp_labels: {severity: warning}}]
  - name: every sandbox start fails
    interval: 1m
    input_series:
      - {series: 'boxcar_sandbox_failures_total{` + sel + `,backend="kubernetes",stage="start"}', values: '0+1x60'}
    alert_rule_test:
      - eval_time: 30m
        alertname: BoxcarSandboxStartFailures
        exp_alerts: [{exp_labels: {severity: warning}}]
  - name: sandbox starts fine, closes fail
    interval: 1m
    input_series:
      - {series: 'boxcar_sandbox_failures_total{` + sel + `,backend="kubernetes",stage="close"}', values: '0+1x60'}
      - {series: 'boxcar_sandbox_start_seconds_count{` + sel + `,backend="kubernetes"}', values: '0+5x60'}
    alert_rule_test:
      - {eval_time: 30m, alertname: BoxcarSandboxStartFailures, exp_alerts: []}

  - name: another release's workers are not this release's
    interval: 1m
    input_series:
      - {series: 'boxcar_queue_pending_jobs{namespace="other",service="boxcar-metrics"}', values: '5x90'}
      - {series: 'boxcar_dead_letters_total{namespace="other",service="boxcar-metrics",reason="x"}', values: '0 0 1 1 1 1'}
    alert_rule_test:
      - {eval_time: 45m, alertname: BoxcarNoProgress, exp_alerts: []}
      - {eval_time: 4m, alertname: BoxcarDeadLetters, exp_alerts: []}
`
	file := filepath.Join(t.TempDir(), "boxcar-rules-test.yaml")
	if err := os.WriteFile(file, []byte(tests), 0o644); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(promtool(t), "test", "rules", file).CombinedOutput()
	if err != nil {
		t.Errorf("promtool test rules: %v\n%s", err, out)
	}
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
