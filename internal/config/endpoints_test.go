package config_test

import (
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/boxcar-run/boxcar/internal/config"
)

// TestURLKeysMatchTheChart: the worker's load refuses a secret, and a query, in the same URL
// keys as the Helm chart's boxcar.checkURLSecrets does in config.*: a worker run from a local
// --config is held to what the chart holds a release to. The chart refused a query in
// config.store.url and config.nats.url no more than the loader did.
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
		loader = append(loader, k.Key+" query:true") // every key refuses one (URLKey.Alone)
	}
	slices.Sort(chart)
	slices.Sort(loader)
	if len(chart) == 0 || !slices.Equal(chart, loader) {
		t.Errorf("the chart refuses secrets in\n%v\nthe loader in\n%v", chart, loader)
	}
}

// TestCheckURLBySource: a URL key's value given by a flag is held to the config file's rule (a
// flag is in the process list), and one from the environment, which may come from a Secret,
// may carry user information where its client logs in with it (NATS_URL), never a query the
// key has no use for. No error holds the secret.
func TestCheckURLBySource(t *testing.T) {
	t.Parallel()
	const secret = "s3cret-91"
	tests := []struct {
		key  string
		from config.URLFrom
		v    string
		want string // "" for none
	}{
		{"nats.url", config.FromFlag, "nats://ann:" + secret + "@127.0.0.1:4222", "holds credentials (a user:password@ or a token@), which every user of the machine sees in the process list; give them with --nats-creds"},
		{"nats.url", config.FromFlag, "nats://127.0.0.1:4222, " + secret + "@127.0.0.1:4223", "holds credentials"},
		{"nats.url", config.FromEnv, "nats://ann:" + secret + "@127.0.0.1:4222", ""},
		{"nats.url", config.FromEnv, "nats://127.0.0.1:4222", ""},
		{"store.url", config.FromFlag, "s3://AKID:" + secret + "@bucket", "holds credentials"},
		{"store.url", config.FromEnv, "s3://AKID:" + secret + "@bucket", "holds credentials (a user:password@ or a token@); put the S3 keys in AWS_ACCESS_KEY_ID"},
		{"store.endpoint", config.FromEnv, "http://AKID:" + secret + "@127.0.0.1:9000", "holds credentials"},
		{"model.base_url", config.FromEnv, "https://" + secret + "@127.0.0.1:1/v1", "holds credentials (a user:password@ or a token@); put the API key in OPENAI_API_KEY"},
		{"store.endpoint", config.FromFlag, "http://127.0.0.1:9000/?X-Amz-Signature=" + secret, "holds a query (such as ?api_key=), which may be a secret, which every user"},
		{"store.endpoint", config.FromEnv, "http://127.0.0.1:9000/?X-Amz-Signature=" + secret, "holds a query (such as ?api_key=), which may be a secret; put the S3 keys in AWS_ACCESS_KEY_ID"},
		{"store.endpoint", config.FromEnv, "http://127.0.0.1:9000", ""},
		{"model.base_url", config.FromEnv, "https://127.0.0.1:1/v1?api_key=" + secret, "holds a query (such as ?api_key=), which may be a secret; put the API key in OPENAI_API_KEY"},
		{"model.base_url", config.FromEnv, "https://ann:" + secret + "@127.0.0.1:1/v1?api_key=" + secret, "holds credentials"},
		{"model.base_url", config.FromEnv, "https://127.0.0.1:1/v1?", "holds a query"},
		{"model.base_url", config.FromFlag, "https://ann:" + secret + "@127.0.0.1:1/v1", "holds credentials"},
		{"model.base_url", config.FromEnv, "ftp://127.0.0.1:1/v1", "is not an http(s) URL"},
		{"model.base_url", config.FromFile, "https://127.0.0.1:1/v1", ""},
		{"nats.url", config.FromFlag, "nats://127.0.0.1:4222?token=" + secret, "holds a query (such as ?api_key=), which may be a secret, which every user"},
		{"nats.url", config.FromEnv, "nats://127.0.0.1:4222, nats://127.0.0.1:4223/?" + secret, "holds a query"},
		{"nats.url", config.FromEnv, "nats://ann:pw@127.0.0.1:4222#" + secret, "holds a fragment"},
		{"store.url", config.FromFlag, "s3://bucket/p?X-Amz-Signature=" + secret, "holds a query"},
		{"store.url", config.FromEnv, "s3://bucket/p?region=eu-west-1", "the region in store.region"},
		{"store.url", config.FromFile, "file:///srv/store#" + secret, "holds a fragment"},
		{"model.base_url", config.FromEnv, "https://127.0.0.1:1/v1#" + secret, "holds a fragment"},
		{"store.url", config.FromFile, "s3://bucket/p", ""},
		// A token with an unescaped '/' reads as a host and a path; the NATS client would dial
		// the token's first part as a host, and name it in its errors.
		{"nats.url", config.FromEnv, "nats://" + secret + "/x@127.0.0.1:4222", "an '@' after the host"},
		{"model.base_url", config.FromEnv, "https://" + secret + "/x@127.0.0.1:1/v1", "an '@' after the host"},
		// So does a store URL: s3://tok/en@bucket names the bucket "tok", and the store's
		// errors name the bucket and the prefix; an '@' that belongs in the path is %40.
		{"store.url", config.FromFile, "s3://" + secret + "/x@bucket/p", "an '@' after the host"},
		{"store.url", config.FromEnv, "file://" + secret + "/x@localhost/srv/store", "an '@' after the host"},
		{"store.url", config.FromFlag, "s3://bucket/p%40x", ""},
	}
	for _, tt := range tests {
		err := config.CheckURL(tt.key, tt.from, tt.v)
		switch {
		case tt.want == "" && err != nil:
			t.Errorf("CheckURL(%s, %d, …) = %v, want nil", tt.key, tt.from, err)
		case tt.want != "" && (err == nil || !strings.Contains(err.Error(), tt.want)):
			t.Errorf("CheckURL(%s, %d, …) = %v, want %q", tt.key, tt.from, err, tt.want)
		case err != nil && strings.Contains(err.Error(), secret):
			t.Errorf("CheckURL(%s, %d, …) quotes the secret: %v", tt.key, tt.from, err)
		}
	}
}
