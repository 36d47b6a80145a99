package helm

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"
)

// alertRow is a row of the alerts table of docs/operations.md.
type alertRow struct {
	line                  int
	alert, when, severity string
}

// alertRows reads the table under "## Alerts" of docs/operations.md: | alert | fires when | severity |.
func alertRows(t *testing.T) []alertRow {
	t.Helper()
	path := filepath.Join("..", "..", "docs", "operations.md")
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var rows []alertRow
	section := false
	for i, line := range strings.Split(string(data), "\n") {
		if strings.HasPrefix(line, "## ") {
			section = line == "## Alerts"
			continue
		}
		cells := strings.Split(strings.Trim(line, "| "), " | ")
		if !section || !strings.HasPrefix(line, "| `") || len(cells) != 3 {
			continue
		}
		rows = append(rows, alertRow{line: i + 1, alert: strings.Trim(cells[0], "`"), when: cells[1], severity: cells[2]})
	}
	if len(rows) == 0 {
		t.Fatalf("%s has no alerts table under \"## Alerts\"", path)
	}
	return rows
}

var (
	// forMinutes and forValue are how a row says the rule's `for`: "for 15 minutes", "for
	// `noWorkersFor` (5m)".
	forMinutes = regexp.MustCompile(`for (\d+) minutes`)
	forValue   = regexp.MustCompile("for `\\w+` \\((\\w+)\\)")
	// namedValue is a value of metrics.prometheusRule a row names with its default:
	// "`jobFailureRatio` (0.2)", "`noProgressWindow` (30m; keep it above …)".
	namedValue = regexp.MustCompile("`(\\w+)` \\(([^);]+)")
	// window is a range a row says the rule looks over ("over 30 minutes", "in the last 15
	// minutes"), exprRange one in the rule's expression ("[30m]").
	window    = regexp.MustCompile(`(?:over|in the last) (\d+) minutes`)
	exprRange = regexp.MustCompile(`\[(\d+)m\]`)
)

// rowFor is the `for` a row states, "" when it states none.
func rowFor(when string) string {
	if m := forValue.FindStringSubmatch(when); m != nil {
		return m[1]
	}
	if m := forMinutes.FindStringSubmatch(when); m != nil {
		return m[1] + "m"
	}
	return ""
}

// sameDuration says whether two Prometheus durations ("15m", "900s") are one.
func sameDuration(a, b string) bool {
	if a == "" || b == "" {
		return a == b
	}
	da, err1 := time.ParseDuration(a)
	db, err2 := time.ParseDuration(b)
	return err1 == nil && err2 == nil && da == db
}

// TestOperationsAlertsTable holds the alerts table of docs/operations.md to the chart's
// PrometheusRule with its default values, both ways: each alert of the chart has a row, each
// row names an alert of the chart, with its severity, its `for`, the windows it looks over and
// the defaults of the values it names.
func TestOperationsAlertsTable(t *testing.T) {
	t.Parallel()
	r := render(t, values(t, "metrics: {prometheusRule: {enabled: true}}"))
	rules := map[string]rule{}
	for _, pr := range all[*prometheusRule](r) {
		for _, g := range pr.Spec.Groups {
			for _, ru := range g.Rules {
				if ru.Alert != "" {
					rules[ru.Alert] = ru
				}
			}
		}
	}
	if len(rules) == 0 {
		t.Fatal("the chart rendered no alert with metrics.prometheusRule.enabled")
	}
	rows := map[string]bool{}
	for _, row := range alertRows(t) {
		rows[row.alert] = true
		at := fmt.Sprintf("docs/operations.md:%d %s", row.line, row.alert)
		ru, ok := rules[row.alert]
		if !ok {
			t.Errorf("%s: the chart has no such alert", at)
			continue
		}
		if row.severity != ru.Labels["severity"] {
			t.Errorf("%s: severity %q, the chart's is %q", at, row.severity, ru.Labels["severity"])
		}
		if got := rowFor(row.when); !sameDuration(got, ru.For) {
			t.Errorf("%s: fires after %q, the chart's for is %q", at, got, ru.For)
		}
		for _, m := range window.FindAllStringSubmatch(row.when, -1) {
			if !slices.ContainsFunc(exprRange.FindAllStringSubmatch(ru.Expr, -1), func(r []string) bool { return r[1] == m[1] }) {
				t.Errorf("%s: says %q, but the chart's expression has no [%sm] range: %s", at, m[0], m[1], ru.Expr)
			}
		}
		for _, m := range namedValue.FindAllStringSubmatch(row.when, -1) {
			v := lookup(r.values, "metrics.prometheusRule."+m[1])
			if v == nil {
				t.Errorf("%s: names `%s`, which is not a value of metrics.prometheusRule", at, m[1])
			} else if fmt.Sprint(v) != m[2] {
				t.Errorf("%s: `%s` (%s), its default is %v", at, m[1], m[2], v)
			}
		}
	}
	for alert := range rules {
		if !rows[alert] {
			t.Errorf("the chart's alert %s has no row in the alerts table of docs/operations.md", alert)
		}
	}
}
