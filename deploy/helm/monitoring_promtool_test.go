//go:build integration

package helm

// What runs promtool (the integration tier): promtool's own check of the rendered rules, and
// its rule unit tests. The fast tier renders and checks the same rules without it.

import (
	"os"
	"os/exec"
	"path/filepath"
	"testing"
)

// promtool finds promtool, or fails with how to install it.
func promtool(t *testing.T) string {
	t.Helper()
	p, err := exec.LookPath("promtool")
	if err != nil {
		t.Fatalf("promtool not found (it checks the alert rules): apt-get install -y prometheus")
	}
	return p
}

// promtoolCheckRules runs `promtool check rules` on a rule file.
func promtoolCheckRules(t *testing.T, file string) {
	t.Helper()
	out, err := exec.Command(promtool(t), "check", "rules", file).CombinedOutput()
	if err != nil {
		t.Errorf("promtool check rules: %v\n%s", err, out)
	}
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
		consumer = `account="$G",stream_name="BOXCAR_JOBS_default",consumer_name="boxcar-workers-default",namespace="nats",service="nats-headless"`
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
      - series: 'boxcar_jobs_total{` + sel + `,profile="p",outcome="failed"}'
        values: '0 0 0 1 1 1 1 1 1 1 1 1 1 1 1 1 1 1 1 1 1 1 1 1 1 1 1 1 1 1 1 1 1 1 1'
    alert_rule_test:
      - {eval_time: 2m, alertname: BoxcarDeadLetters, exp_alerts: []}
      - eval_time: 5m
        alertname: BoxcarDeadLetters
        exp_alerts: [{exp_labels: {severity: warning}}]
      - {eval_time: 30m, alertname: BoxcarDeadLetters, exp_alerts: []}
  - name: a job died after its last delivery
    interval: 1m
    input_series:
      - {series: 'boxcar_dead_letters_total{` + sel + `,reason="max_deliveries"}', values: '0 0 0 1x20'}
      - {series: 'boxcar_jobs_total{` + sel + `,profile="p",outcome="dead"}', values: '0 0 0 1x20'}
    alert_rule_test:
      - eval_time: 5m
        alertname: BoxcarDeadLetters
        exp_alerts: [{exp_labels: {severity: warning}}]
  - name: rejected jobs are the submitters' mistakes, not dead letters to alert on
    interval: 1m
    input_series:
      - {series: 'boxcar_dead_letters_total{` + sel + `,reason="unknown_profile"}', values: '0 0 0 1 2 3 4 5 6 7 8 9 10x10'}
      - {series: 'boxcar_dead_letters_total{` + sel + `,reason="invalid_job"}', values: '0 0 0 2 4 6x15'}
      - {series: 'boxcar_jobs_total{` + sel + `,profile="unknown",outcome="rejected"}', values: '0 0 0 3 6 9 10 11 12 13 14 15 16x10'}
      - {series: 'boxcar_jobs_total{` + sel + `,profile="p",outcome="succeeded"}', values: '0+1x20'}
    alert_rule_test:
      - {eval_time: 5m, alertname: BoxcarDeadLetters, exp_alerts: []}
      - {eval_time: 10m, alertname: BoxcarDeadLetters, exp_alerts: []}

  # boxcar_model_up: 1 while a worker reaches the model, 0 while its circuit is open.
  - name: the model is down for every worker
    interval: 1m
    input_series:
      - {series: 'boxcar_model_up{` + sel + `}', values: '1 1 0x20'}
      - {series: 'boxcar_model_up{namespace="boxcar",service="boxcar-metrics",pod="boxcar-def"}', values: '1 1 0x20'}
    alert_rule_test:
      - {eval_time: 4m, alertname: BoxcarModelDown, exp_alerts: []}
      - eval_time: 10m
        alertname: BoxcarModelDown
        exp_alerts: [{exp_labels: {severity: critical}}]
  - name: one worker still reaches the model
    interval: 1m
    input_series:
      - {series: 'boxcar_model_up{` + sel + `}', values: '1 1 0x20'}
      - {series: 'boxcar_model_up{namespace="boxcar",service="boxcar-metrics",pod="boxcar-def"}', values: '1x22'}
    alert_rule_test:
      - {eval_time: 10m, alertname: BoxcarModelDown, exp_alerts: []}
  - name: the model comes back within the window
    interval: 1m
    input_series:
      - {series: 'boxcar_model_up{` + sel + `}', values: '1 0 0 0 1x20'}
    alert_rule_test:
      - {eval_time: 10m, alertname: BoxcarModelDown, exp_alerts: []}

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
      - {series: 'nats_consumer_num_pending{account="$G",stream_name="OTHER",consumer_name="boxcar-workers-default",is_consumer_leader="true"}', values: '9x30'}
      - {series: 'nats_consumer_num_ack_pending{account="$G",stream_name="OTHER",consumer_name="boxcar-workers-default",is_consumer_leader="true"}', values: '0x30'}
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
      - {series: 'boxcar_jobs_total{namespace="other",service="boxcar-metrics",profile="p",outcome="dead"}', values: '0 0 1 1 1 1'}
      - {series: 'boxcar_model_up{namespace="other",service="boxcar-metrics"}', values: '0x30'}
    alert_rule_test:
      - {eval_time: 45m, alertname: BoxcarNoProgress, exp_alerts: []}
      - {eval_time: 4m, alertname: BoxcarDeadLetters, exp_alerts: []}
      - {eval_time: 20m, alertname: BoxcarModelDown, exp_alerts: []}
`
	promtoolTestRules(t, tests)
}

// promtoolTestRules runs promtool's rule unit tests of tests (a test file's YAML).
func promtoolTestRules(t *testing.T, tests string) {
	t.Helper()
	file := filepath.Join(t.TempDir(), "boxcar-rules-test.yaml")
	if err := os.WriteFile(file, []byte(tests), 0o644); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(promtool(t), "test", "rules", file).CombinedOutput()
	if err != nil {
		t.Errorf("promtool test rules: %v\n%s", err, out)
	}
}

// TestNoWorkersAlertFollowsKEDA: with KEDA, BoxcarNoWorkers fires as KEDA would run a worker
// and none is available. KEDA activates the Deployment when one tenant's trigger, its
// consumer's pending and ack-pending jobs, passes activationLagThreshold, so jobs of several
// tenants each at the threshold are the idle the operator chose, not an outage; and with
// minReplicaCount 1 or more a worker should run whatever waits, so any waiting job with none
// available is one.
func TestNoWorkersAlertFollowsKEDA(t *testing.T) {
	const (
		a       = `account="$G",stream_name="BOXCAR_JOBS_a",consumer_name="boxcar-workers-a",is_consumer_leader="true"`
		b       = `account="$G",stream_name="BOXCAR_JOBS_b",consumer_name="boxcar-workers-b",is_consumer_leader="true"`
		workers = `kube_deployment_status_replicas_available{namespace="boxcar",deployment="boxcar"}`
	)
	series := func(pa, pb string) string {
		return `
      - {series: 'nats_consumer_num_pending{` + a + `}', values: '` + pa + `x30'}
      - {series: 'nats_consumer_num_ack_pending{` + a + `}', values: '0x30'}
      - {series: 'nats_consumer_num_pending{` + b + `}', values: '` + pb + `x30'}
      - {series: 'nats_consumer_num_ack_pending{` + b + `}', values: '0x30'}
      - {series: '` + workers + `', values: '0x30'}`
	}
	firing := `[{exp_labels: {severity: critical}}]`
	for _, tc := range []struct {
		name, values, pa, pb, want string
	}{
		{"two tenants each at the activation threshold", "minReplicaCount: 0, activationLagThreshold: 5", "5", "5", "[]"},
		{"one tenant past the activation threshold", "minReplicaCount: 0, activationLagThreshold: 5", "6", "0", firing},
		{"a minimum of one worker and jobs below the threshold", "minReplicaCount: 1, activationLagThreshold: 5", "3", "0", firing},
		{"a minimum of one worker and nothing waits", "minReplicaCount: 1, activationLagThreshold: 5", "0", "0", "[]"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := render(t, values(t, "metrics: {prometheusRule: {enabled: true}}\nkeda: {enabled: true, "+tc.values+"}\nconfig: {tenants: {a: {profiles: [file-summary]}, b: {profiles: [file-summary]}}}"))
			pr := all[*prometheusRule](r)
			if len(pr) != 1 {
				t.Fatalf("%d PrometheusRules, want 1", len(pr))
			}
			rules := writeRules(t, pr[0], false)
			promtoolTestRules(t, `
rule_files: [`+rules+`]
evaluation_interval: 1m
tests:
  - interval: 1m
    input_series:`+series(tc.pa, tc.pb)+`
    alert_rule_test:
      - {eval_time: 20m, alertname: BoxcarNoWorkers, exp_alerts: `+tc.want+`}
`)
		})
	}
}
