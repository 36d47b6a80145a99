package workercmd

import (
	"context"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/boxcar-run/boxcar/internal/metrics"
)

// metricRow is a row of docs/operations.md's metrics table: | `name` | type | labels | meaning |.
var metricRow = regexp.MustCompile("(?m)^\\| `(boxcar_[a-z_]+)` \\| ([a-z]+) \\|([a-z_, ]*)\\|")

// documentedMetrics reads the metrics table: each name's "type labels" (labels sorted).
func documentedMetrics(t *testing.T) map[string]string {
	t.Helper()
	data, err := os.ReadFile(filepath.Join("..", "..", "docs", "operations.md"))
	if err != nil {
		t.Fatal(err)
	}
	doc := map[string]string{}
	for _, m := range metricRow.FindAllStringSubmatch(string(data), -1) {
		var labels []string
		for l := range strings.SplitSeq(m[3], ",") {
			if l = strings.TrimSpace(l); l != "" {
				labels = append(labels, l)
			}
		}
		doc[m[1]] = shape(m[2], labels)
	}
	return doc
}

func shape(kind string, labels []string) string {
	sort.Strings(labels)
	return kind + " {" + strings.Join(labels, ",") + "}"
}

// registeredMetrics makes every collector the worker does (NewCollectors: its metrics, the
// pool's, the egress proxy's; and the queue's lag), gives each labelled collector
// one series so that it is gathered, and returns each boxcar_ name's "type labels".
func registeredMetrics(t *testing.T) map[string]string {
	t.Helper()
	c := NewCollectors()
	reg := c.Worker.Registry()
	collectors := []any{c.Worker, c.Pool, c.Egress}
	c.Worker.WatchQueue(t.Context(), func(context.Context) ([]metrics.TenantLag, error) {
		return []metrics.TenantLag{{Tenant: "t"}}, nil
	})
	for _, c := range collectors {
		touchVecs(t, reflect.ValueOf(c).Elem())
	}
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]string{}
	for _, f := range families {
		if !strings.HasPrefix(f.GetName(), "boxcar_") {
			continue
		}
		var labels []string
		for _, l := range f.GetMetric()[0].GetLabel() {
			labels = append(labels, l.GetName())
		}
		got[f.GetName()] = shape(kinds[f.GetType()], labels)
	}
	return got
}

var kinds = map[dto.MetricType]string{
	dto.MetricType_COUNTER: "counter", dto.MetricType_GAUGE: "gauge", dto.MetricType_HISTOGRAM: "histogram",
	dto.MetricType_SUMMARY: "summary", dto.MetricType_UNTYPED: "untyped",
}

// variableLabels is the label list of a Desc's String.
var variableLabels = regexp.MustCompile(`variableLabels: \{([^}]*)\}`)

// touchVecs makes one series of each labelled collector among v's fields, with every label "x".
func touchVecs(t *testing.T, v reflect.Value) {
	t.Helper()
	for i := range v.NumField() {
		f := v.Field(i)
		if !f.CanInterface() {
			continue
		}
		c, ok := f.Interface().(prometheus.Collector)
		with := f.MethodByName("WithLabelValues")
		if !ok || !with.IsValid() {
			continue
		}
		ch := make(chan *prometheus.Desc, 1)
		c.Describe(ch)
		labels := variableLabels.FindStringSubmatch((<-ch).String())[1]
		args := []reflect.Value{}
		for range strings.Split(labels, ",") {
			args = append(args, reflect.ValueOf("x"))
		}
		with.Call(args)
	}
}

// TestOperationsDocListsEveryMetric holds docs/operations.md's metrics table to what the
// worker registers, both ways: each metric the worker exports is a row with its type and
// labels, and each row is one it exports.
func TestOperationsDocListsEveryMetric(t *testing.T) {
	t.Parallel()
	doc, got := documentedMetrics(t), registeredMetrics(t)
	names := slices.Sorted(func(yield func(string) bool) {
		for n := range got {
			yield(n)
		}
	})
	for _, name := range names {
		switch d, ok := doc[name]; {
		case !ok:
			t.Errorf("docs/operations.md's metrics table lacks %s (%s), which the worker exports", name, got[name])
		case d != got[name]:
			t.Errorf("docs/operations.md says %s is a %s; the worker exports a %s", name, d, got[name])
		}
	}
	for name := range doc {
		if _, ok := got[name]; !ok {
			t.Errorf("docs/operations.md's metrics table lists %s, which the worker does not export", name)
		}
	}
	if len(got) < 30 || len(doc) < 30 {
		t.Errorf("compared %d metrics with %d rows: not the whole of either", len(got), len(doc))
	}
}
