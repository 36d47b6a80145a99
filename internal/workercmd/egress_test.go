package workercmd

import (
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/boxcar-run/boxcar/internal/config"
)

// TestWorkerEndpoints: each endpoint is denied on the port the worker reaches it on, the
// scheme's default when the URL names none (an http:// store or model listens on 80).
func TestWorkerEndpoints(t *testing.T) {
	tests := []struct {
		name             string
		nats, store, mdl string
		want             []string
	}{
		{"explicit ports", "nats://nats:4222", "http://minio:9000", "http://ollama:11434",
			[]string{"nats:4222", "minio:9000", "ollama:11434"}},
		{"nats default, cluster of two", "nats://a, nats://b:4223", "", "",
			[]string{"a:4222", "b:4223"}},
		{"https defaults", "", "https://s3.internal", "https://model.internal/v1",
			[]string{"s3.internal:443", "model.internal:443"}},
		{"http defaults to 80", "", "http://minio.internal", "http://model-gateway/v1",
			[]string{"minio.internal:80", "model-gateway:80"}},
		{"tls nats", "tls://nats.internal", "", "", []string{"nats.internal:4222"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var cfg config.Config
			cfg.NATS.URL, cfg.Store.Endpoint = tt.nats, tt.store
			if got := workerEndpoints(cfg, tt.mdl); !slices.Equal(got, tt.want) {
				t.Fatalf("workerEndpoints = %q, want %q", got, tt.want)
			}
		})
	}
}

// TestStartRefusesUnusableEgress: the worker (and check-config) checks each networked profile at start as
// its jobs' proxies will (runner.CheckEgress), so that a secret it cannot read, a value the
// proxy refuses (fewer than 12 letters and digits, a line break) or an egress.upstream_ca file
// with no certificate stops it, rather than every job of the profile failing later; the error
// never holds the value.
func TestStartRefusesUnusableEgress(t *testing.T) {
	t.Parallel()
	noPEM := filepath.Join(t.TempDir(), "upstream-ca.pem")
	if err := os.WriteFile(noPEM, []byte("not a certificate\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name, value, upstreamCA string
		ok                      bool
	}{
		{name: "a usable value", value: "sk-live-0123456789abcdef", ok: true},
		{name: "value not set", value: ""},
		{name: "value too short for a placeholder", value: "tok-12345"},
		{name: "value with a line break", value: "sk-live-0123456789abcdef\nsecond-line"},
		{name: "upstream CA without a certificate", value: "sk-live-0123456789abcdef", upstreamCA: noPEM},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			cfg := config.Config{
				Egress: config.Egress{UpstreamCA: tt.upstreamCA},
				Profiles: map[string]config.Profile{"api": {
					Network: &config.Network{Allow: []string{"api.example.com"}},
					Secrets: []config.Secret{{Env: "API_TOKEN", From: "env:BOXCAR_API_TOKEN", Hosts: []string{"api.example.com"}}},
				}},
			}
			getenv := func(k string) string {
				if k == "BOXCAR_API_TOKEN" {
					return tt.value
				}
				return ""
			}
			err := checkProfileEgress(cfg, getenv)
			if (err == nil) != tt.ok {
				t.Fatalf("checkProfileEgress: %v; want an error: %v (every job of profile api would fail on it)", err, !tt.ok)
			}
			if err != nil && tt.value != "" && strings.Contains(err.Error(), tt.value) {
				t.Fatal("the error holds the value")
			}
		})
	}
}

// TestProxyConfigAddressSettings: the egress section's address settings reach every proxy,
// the network's NAT64 prefixes among them (without them an address in one is checked as IPv6
// only, whatever IPv4 address it carries).
func TestProxyConfigAddressSettings(t *testing.T) {
	cfg, err := config.Parse([]byte("egress: {denied_cidrs: [10.9.0.0/16], allowed_cidrs: [10.0.0.0/8], nat64_prefixes: ['2600:1f00:64::/96']}\nprofiles: {p: {model: {name: m}, tools: [{name: read_file}]}}\n"))
	if err != nil {
		t.Fatal(err)
	}
	ec, err := proxyConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if got := fmt.Sprint(ec.DeniedCIDRs, ec.AllowedCIDRs, ec.NAT64Prefixes); got != "[10.9.0.0/16] [10.0.0.0/8] [2600:1f00:64::/96]" {
		t.Errorf("denied, allowed and NAT64 prefixes %s; want the config's", got)
	}
}

// TestStartNamesTheSecretsVariableAndKey: a profile secret whose variable is not set or is
// empty stops the worker with an error that names the config key (profiles.P.secrets[i].from)
// and the variable, so the operator knows what to set where; it holds no value. A variable
// whose name is not written as variables are (BOXCAR_API_TOKEN) may be the value pasted after
// env:, and is not shown.
func TestStartNamesTheSecretsVariableAndKey(t *testing.T) {
	t.Parallel()
	const pasted = "ghp_R3alT0kenValue0123456789abcdefABCD"
	tests := []struct {
		name, from string
		env        map[string]string
		want       []string
	}{
		{"not set", "env:BOXCAR_API_TOKEN", nil, []string{"profiles.api.secrets[1].from", "BOXCAR_API_TOKEN", "not set"}},
		{"empty", "env:BOXCAR_API_TOKEN", map[string]string{"BOXCAR_API_TOKEN": ""}, []string{"profiles.api.secrets[1].from", "BOXCAR_API_TOKEN"}},
		{"a short name", "env:GH_PAT", nil, []string{"profiles.api.secrets[1].from", "GH_PAT"}},
		{"a value pasted after env:", "env:" + pasted, nil, []string{"profiles.api.secrets[1].from", "not shown"}},
		{"a base32 value pasted after env:", "env:JBSWY3DPEHPK3PXPJBSWY3DP", nil, []string{"profiles.api.secrets[1].from", "not shown"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			cfg := config.Config{Profiles: map[string]config.Profile{"api": {
				Network: &config.Network{Allow: []string{"api.example.com"}},
				Secrets: []config.Secret{
					{Env: "OTHER_TOKEN", From: "env:BOXCAR_OTHER_TOKEN", Hosts: []string{"api.example.com"}},
					{Env: "API_TOKEN", From: tt.from, Hosts: []string{"api.example.com"}},
				},
			}}}
			env := map[string]string{"BOXCAR_OTHER_TOKEN": "sk-other-0123456789abcdef"}
			maps.Copy(env, tt.env)
			err := checkProfileEgress(cfg, func(k string) string { return env[k] })
			if err == nil {
				t.Fatal("checkProfileEgress: nil; want the secret refused")
			}
			msg := err.Error()
			for _, v := range []string{pasted, "JBSWY3DPEHPK3PXPJBSWY3DP", "sk-other-0123456789abcdef"} {
				if strings.Contains(msg, v) {
					t.Fatalf("the error holds a value: %s", strings.ReplaceAll(msg, v, "<VALUE>"))
				}
			}
			for _, w := range tt.want {
				if !strings.Contains(msg, w) {
					t.Errorf("the error %q does not say %q", msg, w)
				}
			}
		})
	}
}
