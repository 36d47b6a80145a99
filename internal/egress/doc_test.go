package egress

import (
	"os"
	"path/filepath"
	refl "reflect"
	"regexp"
	"strings"
	"testing"
	"time"

	"go.yaml.in/yaml/v3"
)

// upper is where a Go field name's next word starts, for its config key (MaxRequests →
// max_requests).
var upper = regexp.MustCompile(`([a-z])([A-Z])`)

// TestConfigurationDocShowsTheProxyDefaults: the egress.limits of the reference block of
// docs/configuration.md are the proxy's own defaults (withDefaults), key for key. The worker
// passes zero on to the proxy, so the config's defaults test cannot see them: a default changed
// here left the reference saying the old one.
func TestConfigurationDocShowsTheProxyDefaults(t *testing.T) {
	t.Parallel()
	path := filepath.Join("..", "..", "docs", "configuration.md")
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	_, rest, ok := strings.Cut(string(data), "```yaml\n")
	block, _, ok2 := strings.Cut(rest, "```\n")
	if !ok || !ok2 {
		t.Fatalf("%s has no ```yaml block", path)
	}
	var doc struct {
		Egress struct {
			Limits map[string]any `yaml:"limits"`
		} `yaml:"egress"`
	}
	if err := yaml.Unmarshal([]byte(block), &doc); err != nil {
		t.Fatalf("the reference block of %s: %v", path, err)
	}
	shown := doc.Egress.Limits
	def := refl.ValueOf(Config{}.withDefaults().Limits)
	for i := range def.NumField() {
		key := strings.ToLower(upper.ReplaceAllString(def.Type().Field(i).Name, "${1}_$2"))
		want := def.Field(i).Interface()
		v, ok := shown[key]
		delete(shown, key)
		if !ok {
			t.Errorf("%s's egress.limits lacks %s (default %v)", path, key, want)
			continue
		}
		var got any
		if d, isDur := want.(time.Duration); isDur {
			s, _ := v.(string)
			if got, err = time.ParseDuration(s); err != nil {
				t.Errorf("%s's egress.limits.%s is %v, not a duration (default %v)", path, key, v, d)
				continue
			}
		} else {
			got = refl.ValueOf(v).Convert(def.Field(i).Type()).Interface()
		}
		if got != want {
			t.Errorf("%s shows egress.limits.%s %v, but the proxy's default is %v", path, key, v, want)
		}
	}
	for key := range shown {
		t.Errorf("%s shows egress.limits.%s, which the proxy does not have", path, key)
	}
}
