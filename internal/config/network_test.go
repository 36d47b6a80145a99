package config_test

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/boxcar-run/boxcar/internal/config"
)

// networkProfile is the example profile, with its secret's hosts replaced by hosts.
func networkProfile(allow, hosts string) string {
	return profile("network:\n  allow: " + allow + "\nsecrets:\n  - env: EXAMPLE_TOKEN\n    from: env:BOXCAR_EXAMPLE_TOKEN\n    hosts: " + hosts + "\n")
}

func TestNetworkProfileParses(t *testing.T) {
	cfg, err := config.Parse([]byte(networkProfile(`["api.example.com", "packages.example.com:443", "*.files.example.com"]`, `["api.example.com", "a.files.example.com:443"]`)))
	if err != nil {
		t.Fatalf("Parse: %v", err)
	}
	p := cfg.Profiles["p"]
	if p.Network == nil || len(p.Network.Allow) != 3 || len(p.Secrets) != 1 || p.Secrets[0].Hosts[1] != "a.files.example.com:443" {
		t.Errorf("network %+v, secrets %+v: want the three allow entries and the secret as written", p.Network, p.Secrets)
	}
	cfg, err = config.Parse([]byte(profile("")))
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Profiles["p"].Network != nil {
		t.Errorf("a profile without network got %+v; want none (no network at all)", cfg.Profiles["p"].Network)
	}
}

// TestInvalidNetworkNamesTheField: each mistake in a profile's network or secrets, and in the
// worker's egress settings, is refused with the field it is in.
func TestInvalidNetworkNamesTheField(t *testing.T) {
	secret := func(env, from, hosts string) string {
		return profile("network: {allow: [api.example.com, '*.example.org']}\nsecrets:\n  - {env: " + env + ", from: '" + from + "', hosts: " + hosts + "}\n")
	}
	tests := []struct {
		name      string
		yaml      string
		wantField string
	}{
		{"empty allow", profile("network: {allow: []}"), "profiles.p.network.allow"},
		{"allow an address", profile("network: {allow: ['10.0.0.1']}"), "profiles.p.network.allow[0]"},
		{"allow a bad port", profile("network: {allow: ['a.example.com:99999']}"), "profiles.p.network.allow[0]"},
		{"allow a bad name", profile("network: {allow: ['a b.example.com']}"), "profiles.p.network.allow[0]"},
		{"allow a whole tld", profile("network: {allow: ['*.com']}"), "profiles.p.network.allow[0]"},
		{"allow a url", profile("network: {allow: ['https://a.example.com/']}"), "profiles.p.network.allow[0]"},
		{"secret without network", profile("secrets: [{env: T, from: 'env:X', hosts: [a.example.com]}]"), "profiles.p.secrets"},
		{"secret host not allowed", secret("T", "env:X", "[evil.example.net]"), "profiles.p.secrets[0].hosts[0]"},
		{"secret host under a wildcard's own name", secret("T", "env:X", "[example.org]"), "profiles.p.secrets[0].hosts[0]"},
		{"secret with no hosts", secret("T", "env:X", "[]"), "profiles.p.secrets[0].hosts"},
		{"secret env name", secret("1T", "env:X", "[api.example.com]"), "profiles.p.secrets[0].env"},
		{"secret env reserved", secret("HTTPS_PROXY", "env:X", "[api.example.com]"), "profiles.p.secrets[0].env"},
		{"secret env reserved in lower case", secret("https_proxy", "env:X", "[api.example.com]"), "profiles.p.secrets[0].env"},
		{"secret from scheme", secret("T", "vault:x", "[api.example.com]"), "profiles.p.secrets[0].from"},
		{"secret from env name", secret("T", "env:A-B", "[api.example.com]"), "profiles.p.secrets[0].from"},
		{"secret from relative file", secret("T", "file:token", "[api.example.com]"), "profiles.p.secrets[0].from"},
		{"bad denied cidr", "egress: {denied_cidrs: [10.0.0.0]}\n" + profile(""), "egress.denied_cidrs[0]"},
		{"bad allowed cidr", "egress: {allowed_cidrs: [nope]}\n" + profile(""), "egress.allowed_cidrs[0]"},
		{"bad NAT64 prefix", "egress: {nat64_prefixes: [nope]}\n" + profile(""), "egress.nat64_prefixes[0]"},
		{"NAT64 prefix of no RFC 6052 length", "egress: {nat64_prefixes: ['2600:1f00:64::/80']}\n" + profile(""), "egress.nat64_prefixes[0]"},
		{"resolver without port", "egress: {resolver: 10.0.0.2}\n" + profile(""), "egress.resolver"},
		{"negative cap", "egress: {limits: {max_tunnels: -1}}\n" + profile(""), "egress.limits"},
		{"tiny header cap", "egress: {limits: {max_header_bytes: 100}}\n" + profile(""), "egress.limits.max_header_bytes"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) { wantInvalid(t, tt.yaml, tt.wantField) })
	}
	// Two secrets with one name.
	twice := profile("network: {allow: [a.example.com]}\nsecrets:\n  - {env: T, from: 'env:X', hosts: [a.example.com]}\n  - {env: T, from: 'env:Y', hosts: [a.example.com]}\n")
	if _, err := config.Parse([]byte(twice)); !errors.Is(err, config.ErrInvalid) || !strings.Contains(err.Error(), "secrets[1].env:") {
		t.Errorf("a secret declared twice: %v, want secrets[1].env named", err)
	}
}

// TestSecretHostsCoveredByAllow: a secret's host may be any host an allow entry matches,
// including one under a wildcard or on an allowed port, and nothing wider.
func TestSecretHostsCoveredByAllow(t *testing.T) {
	tests := []struct {
		allow, host string
		ok          bool
	}{
		{"api.example.com", "api.example.com", true},
		{"api.example.com", "api.example.com:443", true},
		{"api.example.com:443", "api.example.com:443", true},
		{"api.example.com:443", "api.example.com", false},
		{"api.example.com:443", "api.example.com:8443", false},
		{"*.example.com", "a.b.example.com", true},
		{"*.example.com", "*.b.example.com", true},
		{"*.example.com", "*.example.com", true},
		{"*.example.com", "example.com", false},
		{"*.example.com:443", "a.example.com", false},
		{"api.example.com", "*.api.example.com", false},
		{"API.Example.com", "api.example.COM", true},
	}
	for _, tt := range tests {
		t.Run(tt.allow+" covers "+tt.host, func(t *testing.T) {
			_, err := config.Parse([]byte(networkProfile("['"+tt.allow+"']", "['"+tt.host+"']")))
			if got := err == nil; got != tt.ok {
				t.Errorf("Parse: %v; want accepted = %v", err, tt.ok)
			}
		})
	}
}

func TestReadSecret(t *testing.T) {
	const value = "s3cr3t-value-0123456789"
	dir := t.TempDir()
	file := filepath.Join(dir, "token")
	if err := os.WriteFile(file, []byte(value+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "empty"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	env := map[string]string{"TOKEN": value, "EMPTY": ""}
	lookup := func(k string) (string, bool) { v, ok := env[k]; return v, ok }
	tests := []struct {
		name, from string
		wantErr    bool
	}{
		{"env", "env:TOKEN", false},
		{"file without its newline", "file:" + file, false},
		{"env not set", "env:MISSING", true},
		{"env empty", "env:EMPTY", true},
		{"file missing", "file:" + filepath.Join(dir, "missing"), true},
		{"file empty", "file:" + filepath.Join(dir, "empty"), true},
		{"unknown scheme", "vault:x", true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := config.ReadSecret(tt.from, lookup)
			if tt.wantErr {
				if !errors.Is(err, config.ErrSecretUnavailable) {
					t.Fatalf("ReadSecret(%s) = %v, want ErrSecretUnavailable", tt.from, err)
				}
				return
			}
			if err != nil || got != value {
				t.Fatalf("ReadSecret(%s): %v (value matches: %v)", tt.from, err, got == value)
			}
		})
	}
}

// TestSecretSourceErrorsQuoteNothing: a secret's `from` names where the value is, and the one
// mistake it invites is the value itself pasted there. Neither the config's error (in the
// worker's start error and check-config's output, which are logged) nor ReadSecret's (at start
// and in a job's status) may quote it: they name the field and the form expected ("never by
// value", docs/configuration.md).
func TestSecretSourceErrorsQuoteNothing(t *testing.T) {
	t.Parallel()
	const value = "ghp_R3alT0kenValue0123456789abcdefABCD"
	for _, from := range []string{value, "Bearer " + value, "env:" + value + "-x", "file:" + value, "env: " + value} {
		t.Run(from[:6], func(t *testing.T) {
			t.Parallel()
			yaml := `
profiles:
  api:
    model: {name: m}
    tools: [{name: read_file}]
    network: {allow: [api.example.com]}
    secrets: [{env: API_TOKEN, from: "` + from + `", hosts: [api.example.com]}]
`
			_, err := config.Parse([]byte(yaml))
			if err == nil {
				t.Fatal("Parse accepted the pasted value")
			}
			if strings.Contains(err.Error(), value) {
				t.Fatalf("the error quotes the value pasted in from: %v", strings.ReplaceAll(err.Error(), value, "<VALUE>"))
			}
			if !strings.Contains(err.Error(), "profiles.api.secrets[0].from") {
				t.Fatalf("the error does not name the field: %v", strings.ReplaceAll(err.Error(), value, "<VALUE>"))
			}
		})
	}
	// A value pasted after "env:" is a variable's name in form: the variable is not set.
	noEnv := func(string) (string, bool) { return "", false }
	for _, from := range []string{"env:" + value, "env:" + value + "-x", value} {
		if _, err := config.ReadSecret(from, noEnv); err == nil || strings.Contains(err.Error(), value) {
			t.Errorf("ReadSecret(%s...): %v", from[:6], strings.ReplaceAll(fmt.Sprint(err), value, "<VALUE>"))
		}
	}
}
