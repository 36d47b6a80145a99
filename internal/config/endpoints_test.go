package config_test

import (
	"os"
	"regexp"
	"slices"
	"strconv"
	"testing"

	"github.com/boxcar-run/boxcar/internal/config"
)

// TestURLKeysMatchTheChart: the worker's load refuses a secret in the same URL keys, and a
// query in the same ones, as the Helm chart's boxcar.checkURLSecrets does in config.*: a worker
// run from a local --config is held to what the chart holds a release to.
func TestURLKeysMatchTheChart(t *testing.T) {
	t.Parallel()
	tpl, err := os.ReadFile("../../deploy/helm/boxcar/templates/_helpers.tpl")
	if err != nil {
		t.Fatal(err)
	}
	// (list "config.store.endpoint" (dig …) "the worker ConfigMap" $s3 true)
	row := regexp.MustCompile(`\(list "config\.([a-z_.]+)" .* (true|false)\)`)
	var chart, loader []string
	for _, m := range row.FindAllStringSubmatch(string(tpl), -1) {
		chart = append(chart, m[1]+" query:"+m[2])
	}
	for _, k := range config.URLKeys {
		loader = append(loader, k.Key+" query:"+strconv.FormatBool(k.Query))
	}
	slices.Sort(chart)
	slices.Sort(loader)
	if len(chart) == 0 || !slices.Equal(chart, loader) {
		t.Errorf("the chart refuses secrets in\n%v\nthe loader in\n%v", chart, loader)
	}
}
