package workercmd

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/boxcar-run/boxcar/internal/cli"
)

// TestCheckConfigWarnsOfAnAllowedEndpoint: a network.allow entry that names one of the
// worker's own endpoints by host and port (NATS, store, model, as the worker reaches them after
// the environment and with default ports) is a warning naming the entry, the profile and the
// endpoint: the egress proxy refuses it whatever the entry says, and check-config said ok.
// Entries that name more than the endpoint (no port, another port, a wildcard) say nothing.
func TestCheckConfigWarnsOfAnAllowedEndpoint(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name, allow string
		env         map[string]string
		want        string // the endpoint the warning names; "" for none
	}{
		{name: "NATS", allow: "nats.corp.internal:4222", want: "NATS"},
		{name: "NATS, its default port", allow: "nats2.corp.internal:4222", want: "NATS"},
		{name: "NATS, another case", allow: "NATS.Corp.Internal:4222", want: "NATS"},
		{name: "NATS from NATS_URL", allow: "queue.corp.internal:4333", env: map[string]string{"NATS_URL": "nats://queue.corp.internal:4333"}, want: "NATS"},
		{name: "store, http's default port", allow: "minio.corp.internal:80", want: "store"},
		{name: "model", allow: "llm.corp.internal:8000", want: "model"},
		{name: "model from OPENAI_BASE_URL", allow: "api.corp.internal:443", env: map[string]string{"OPENAI_BASE_URL": "https://api.corp.internal/v1"}, want: "model"},
		{name: "the host without a port", allow: "nats.corp.internal"},
		{name: "another port of the host", allow: "nats.corp.internal:8222"},
		{name: "a wildcard", allow: "*.corp.internal:4222"},
		{name: "NATS_URL replaces the config's", allow: "nats.corp.internal:4222", env: map[string]string{"NATS_URL": "nats://queue.corp.internal:4333"}},
		{name: "another host", allow: "example.com:443"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			dir := t.TempDir()
			model := ""
			if tt.env["OPENAI_BASE_URL"] == "" {
				model = `base_url: "http://llm.corp.internal:8000/v1"`
			}
			cfg := `nats: {url: "nats://nats.corp.internal:4222,nats://nats2.corp.internal"}
store: {url: "s3://jobs", endpoint: "http://minio.corp.internal", region: us-east-1}
model: {` + model + `}
profiles:
  net:
    model: {name: m}
    tools: [{name: read_file}]
    network: {allow: ["example.org", "` + tt.allow + `"]}
  quiet:
    model: {name: m}
    tools: [{name: read_file}]
`
			path := filepath.Join(dir, "boxcar.yaml")
			if err := os.WriteFile(path, []byte(cfg), 0o600); err != nil {
				t.Fatal(err)
			}
			var out bytes.Buffer
			err := Run(t.Context(), []string{"check-config", path}, func(k string) string { return tt.env[k] }, &out, &out)
			if code, msg := cli.ExitCode(err); code != 0 {
				t.Fatalf("check-config: exit %d, %s; want 0 (a warning is no problem)\n%s", code, msg, out.String())
			}
			var warnings []string
			for _, l := range strings.Split(out.String(), "\n") {
				if strings.HasPrefix(l, "warning:") {
					warnings = append(warnings, l)
				}
			}
			if tt.want == "" {
				if len(warnings) != 0 {
					t.Errorf("check-config with network.allow %q warns:\n%s", tt.allow, out.String())
				}
				return
			}
			want := `warning: profiles.net.network.allow: "` + tt.allow + `" is the worker's ` + tt.want + " endpoint, which the egress proxy never lets a sandbox reach"
			if len(warnings) != 1 || !strings.HasPrefix(warnings[0], want) {
				t.Errorf("check-config with network.allow %q prints\n%s\nwant one line starting %q", tt.allow, out.String(), want)
			}
		})
	}
}
