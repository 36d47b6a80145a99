package workercmd

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// urlSecret is the password of the malformed URLs below; every form of it holds "s3cr".
const urlSecret = "Hunter2-s3cr"

// badCredentialURLs are URLs whose password was written as it is, each breaking url.Parse in
// its own way: url.Parse, nats.go, http.NewRequest and the AWS SDK quote such a URL whole in
// their errors.
var badCredentialURLs = map[string]string{
	"bad escape": "://boxcar:" + urlSecret + "%ZZet@127.0.0.1:1",
	"slash":      "://boxcar:" + urlSecret + "/et@127.0.0.1:1",
	"question":   "://boxcar:" + urlSecret + "?et@127.0.0.1:1",
	"hash":       "://boxcar:" + urlSecret + "#et@127.0.0.1:1",
	"space":      "://boxcar:" + urlSecret + " et@127.0.0.1:1",
}

// TestURLCredentialsNeverInOutput: a URL with a password that does not parse, given in any
// field of the config or any variable of the environment, stops the worker, check-config and
// setup with an error that names where it came from and holds no part of the password
// (queue.RedactURL and docs/security.md promise as much of logs, /readyz and errors).
func TestURLCredentialsNeverInOutput(t *testing.T) {
	t.Parallel()
	type source struct {
		name, scheme string   // the field or variable, and the scheme its URL takes
		env          bool     // an environment variable over a good config, not a config field
		skip         []string // entry points that do not read it
	}
	sources := []source{
		{name: "nats.url", scheme: "nats"},
		{name: "store.url", scheme: "s3"},
		{name: "store.endpoint", scheme: "http"},
		{name: "model.base_url", scheme: "https"},
		{name: "network.allow", scheme: "https"},
		{name: "NATS_URL", scheme: "nats", env: true},
		{name: "BOXCAR_STORE", scheme: "s3", env: true},
		{name: "OPENAI_BASE_URL", scheme: "https", env: true, skip: []string{"worker setup"}},
	}
	for _, src := range sources {
		for form, rest := range badCredentialURLs {
			t.Run(src.name+"/"+form, func(t *testing.T) {
				t.Parallel()
				url := src.scheme + rest
				cfgPath, getenv := urlConfig(t, src.name, url, src.env)
				for entry, run := range urlEntryPoints(cfgPath, getenv) {
					if slices.Contains(src.skip, entry) {
						continue
					}
					out, err := run(t.Context())
					if err == nil {
						t.Fatalf("%s: no error from %s", entry, src.name)
					}
					all := err.Error() + "\n" + out
					if strings.Contains(all, "s3cr") || strings.Contains(all, "boxcar:") {
						t.Errorf("%s: the password of %s reaches the output:\n%s", entry, src.name, all)
					}
					if !strings.Contains(all, src.name) {
						t.Errorf("%s: the error does not name %s:\n%s", entry, src.name, all)
					}
				}
			})
		}
	}
}

// urlConfig writes a config that holds url at field, a key path such as store.endpoint (or a
// good config, the url then in the environment variable field), and returns it with the
// environment.
func urlConfig(t *testing.T, field, url string, env bool) (string, func(string) string) {
	t.Helper()
	dir := t.TempDir()
	sections := map[string]map[string]string{
		"nats":  {"url": "nats://127.0.0.1:1"},
		"store": {"url": "file://" + filepath.Join(dir, "store")},
		"model": {},
	}
	network := ""
	vars := map[string]string{}
	switch section, key, _ := strings.Cut(field, "."); {
	case env:
		vars[field] = url
	case field == "network.allow":
		network = "    network: {allow: [\"" + url + "\"]}\n"
	default:
		sections[section][key] = url
	}
	var cfg strings.Builder
	for _, name := range []string{"nats", "store", "model"} {
		cfg.WriteString(name + ": {")
		for k, v := range sections[name] {
			cfg.WriteString(k + ": \"" + v + "\", ")
		}
		cfg.WriteString("}\n")
	}
	cfg.WriteString("profiles:\n  p:\n    model: {name: m}\n    tools: [{name: read_file}]\n" + network)
	path := filepath.Join(dir, "boxcar.yaml")
	if err := os.WriteFile(path, []byte(cfg.String()), 0o600); err != nil {
		t.Fatal(err)
	}
	return path, func(k string) string { return vars[k] }
}

// urlEntryPoints are the ways the worker command reads a config and its environment.
func urlEntryPoints(cfgPath string, getenv func(string) string) map[string]func(context.Context) (string, error) {
	return map[string]func(context.Context) (string, error){
		"worker": func(ctx context.Context) (string, error) {
			var errOut bytes.Buffer
			w, err := Start(ctx, Options{ConfigPath: cfgPath, DataDir: filepath.Dir(cfgPath), MetricsAddr: "127.0.0.1:0", Getenv: getenv, Stderr: &errOut})
			if err == nil {
				w.Stop()
				_ = w.Wait()
			}
			return errOut.String(), err
		},
		"worker check-config": func(ctx context.Context) (string, error) {
			var out, errOut bytes.Buffer
			err := Run(ctx, []string{"check-config", cfgPath}, getenv, &out, &errOut)
			return out.String() + errOut.String(), err
		},
		"worker setup": func(ctx context.Context) (string, error) {
			var out, errOut bytes.Buffer
			err := Run(ctx, []string{"setup", "--config", cfgPath}, getenv, &out, &errOut)
			return out.String() + errOut.String(), err
		},
	}
}

// TestURLSecretsInAConfigRefused: a well-formed URL that carries a secret (a user:password@ or
// a token@, or a query where the key has no use for one) in a config key stops the worker,
// check-config and setup at load, naming the key and where the secret belongs, and no part of
// the secret reaches the error or the output; the environment's variables are where secrets go.
func TestURLSecretsInAConfigRefused(t *testing.T) {
	t.Parallel()
	tests := []struct{ name, field, url, belongs string }{
		{"password", "nats.url", "nats://boxcar:" + urlSecret + "@127.0.0.1:1", "--nats-creds"},
		{"token in the second", "nats.url", "nats://127.0.0.1:1, " + urlSecret + "@127.0.0.1:2", "--nats-creds"},
		{"keys", "store.url", "s3://AKIDEXAMPLE:" + urlSecret + "@results/p", "AWS_SECRET_ACCESS_KEY"},
		{"keys", "store.endpoint", "http://AKIDEXAMPLE:" + urlSecret + "@127.0.0.1:1", "AWS_SECRET_ACCESS_KEY"},
		{"signature", "store.endpoint", "http://127.0.0.1:1/?X-Amz-Signature=" + urlSecret, "AWS_SECRET_ACCESS_KEY"},
		{"password", "model.base_url", "https://boxcar:" + urlSecret + "@127.0.0.1:1/v1", "OPENAI_API_KEY"},
		{"key in the query", "model.base_url", "https://127.0.0.1:1/v1?api_key=" + urlSecret, "OPENAI_API_KEY"},
	}
	for _, tt := range tests {
		t.Run(tt.field+"/"+tt.name, func(t *testing.T) {
			t.Parallel()
			cfgPath, getenv := urlConfig(t, tt.field, tt.url, false)
			for entry, run := range urlEntryPoints(cfgPath, getenv) {
				out, err := run(t.Context())
				if err == nil {
					t.Fatalf("%s: no error from a secret in %s", entry, tt.field)
				}
				all := err.Error() + "\n" + out
				if strings.Contains(all, "s3cr") {
					t.Errorf("%s: the secret of %s reaches the output:\n%s", entry, tt.field, all)
				}
				if !strings.Contains(all, tt.field+": holds") || !strings.Contains(all, tt.belongs) {
					t.Errorf("%s: the error does not name %s and say to use %s:\n%s", entry, tt.field, tt.belongs, all)
				}
			}
		})
	}
}

// TestURLSecretsInTheEnvironment: NATS_URL may carry a URL's user information (it may come
// from a Secret; docs/security.md), no other variable (its client ignores it, or quotes it in
// its errors), and none a query, which nothing would read and the logs would show: each is
// refused naming the variable and where the secret belongs (NATS_URL's query was taken).
func TestURLSecretsInTheEnvironment(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name, env, url string
		want           []string // in the output; nil: only that the secret is not there
		skip           []string // entry points that do not read it
	}{
		{name: "model key in the query", env: "OPENAI_BASE_URL", url: "https://127.0.0.1:1/v1?api_key=" + urlSecret,
			want: []string{"OPENAI_BASE_URL: holds a query", "OPENAI_API_KEY"}, skip: []string{"worker setup"}},
		{name: "model token in the URL", env: "OPENAI_BASE_URL", url: "https://" + urlSecret + "@127.0.0.1:1/v1",
			want: []string{"OPENAI_BASE_URL: holds credentials", "OPENAI_API_KEY"}, skip: []string{"worker setup"}},
		{name: "store keys in the URL", env: "BOXCAR_STORE", url: "s3://AKIDEXAMPLE:" + urlSecret + "@results",
			want: []string{"BOXCAR_STORE: holds credentials", "AWS_SECRET_ACCESS_KEY"}},
		{name: "NATS token in the query", env: "NATS_URL", url: "nats://127.0.0.1:1/?auth_token=" + urlSecret,
			want: []string{"NATS_URL: holds a query", "nats://host:port"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			cfgPath, getenv := urlConfig(t, tt.env, tt.url, true)
			for entry, run := range urlEntryPoints(cfgPath, getenv) {
				if slices.Contains(tt.skip, entry) {
					continue
				}
				out, err := run(t.Context())
				all := out
				if err != nil {
					all = err.Error() + "\n" + out
				}
				if strings.Contains(all, "s3cr") {
					t.Errorf("%s: the secret of %s reaches the output:\n%s", entry, tt.env, all)
				}
				for _, w := range tt.want {
					if err == nil || !strings.Contains(all, w) {
						t.Errorf("%s: %v; want an error that says %q:\n%s", entry, err, w, all)
					}
				}
			}
		})
	}
}
