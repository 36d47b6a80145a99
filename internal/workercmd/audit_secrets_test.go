package workercmd

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/boxcar-run/boxcar/internal/config"
)

// TestAuditSecretsStartAcceptsUnusableEgress: the worker reads each profile's secrets at
// start "so that one that cannot be read stops the worker at start instead of failing its jobs
// later" (egressConfig), but a value it can read and the proxy refuses (fewer than 12 letters
// and digits, a line break), or an egress.upstream_ca file with no certificate, passes: the
// worker starts ready and every job of the profile then fails for good at egress.New
// (queue.Permanent("invalid_profile"), runner/egress.go), blamed on the profile.
func TestAuditSecretsStartAcceptsUnusableEgress(t *testing.T) {
	t.Parallel()
	noPEM := filepath.Join(t.TempDir(), "upstream-ca.pem")
	if err := os.WriteFile(noPEM, []byte("not a certificate\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name, value, upstreamCA string
	}{
		{"value too short for a placeholder", "tok-12345", ""},
		{"value with a line break", "sk-live-0123456789abcdef\nsecond-line", ""},
		{"upstream CA without a certificate", "sk-live-0123456789abcdef", noPEM},
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
			lookup := func(k string) (string, bool) {
				if k == "BOXCAR_API_TOKEN" {
					return tt.value, true
				}
				return "", false
			}
			if _, err := egressConfig(cfg, "http://127.0.0.1:1/v1", lookup, prometheus.NewRegistry()); err == nil {
				t.Fatal("the worker starts with an egress every job of profile api will fail on (invalid_profile, permanent)")
			}
		})
	}
}
