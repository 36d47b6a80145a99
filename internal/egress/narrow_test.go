package egress_test

import (
	"errors"
	"slices"
	"testing"

	"github.com/boxcar-run/boxcar/internal/egress"
)

func TestNarrow(t *testing.T) {
	profile := egress.Policy{
		Allow: []string{"api.example.com", "packages.example.com:443", "*.files.example.com", "198.18.0.5:8080", "*.svc.example.com"},
		Secrets: []egress.Secret{
			{Env: "API_TOKEN", Value: "api-0123456789abcdef", Hosts: []string{"api.example.com"}},
			{Env: "FILES_TOKEN", Value: "files-0123456789abcdef", Hosts: []string{"*.files.example.com", "packages.example.com"}},
			// Bound to port 443 of the hosts the profile allows on any port: whatever else
			// listens on them must never see the value, whatever a job narrows to.
			{Env: "SVC_TOKEN", Value: "svc-0123456789abcdef", Hosts: []string{"*.svc.example.com:443", "198.18.0.5:8080"}},
		},
	}
	for _, tt := range []struct {
		name    string
		allow   []string
		widens  bool
		secrets []string // the secrets kept, as ENV=host,host
	}{
		{name: "the same list", allow: profile.Allow, secrets: []string{"API_TOKEN=api.example.com", "FILES_TOKEN=*.files.example.com,packages.example.com", "SVC_TOKEN=*.svc.example.com:443,198.18.0.5:8080"}},
		{name: "one host", allow: []string{"api.example.com"}, secrets: []string{"API_TOKEN=api.example.com"}},
		{name: "a port of a host allowed on any", allow: []string{"api.example.com:443"}, secrets: []string{"API_TOKEN=api.example.com"}},
		{name: "a name under a wildcard", allow: []string{"eu.files.example.com:443"}, secrets: []string{"FILES_TOKEN=eu.files.example.com"}},
		{name: "a narrower wildcard", allow: []string{"*.eu.files.example.com", "packages.example.com:443"}, secrets: []string{"FILES_TOKEN=*.eu.files.example.com,packages.example.com"}},
		{name: "nothing", allow: []string{}},
		{name: "the IP literal", allow: []string{"198.18.0.5:8080"}, secrets: []string{"SVC_TOKEN=198.18.0.5:8080"}},
		{name: "a name under a ported binding keeps its port", allow: []string{"api.svc.example.com"}, secrets: []string{"SVC_TOKEN=api.svc.example.com:443"}},
		{name: "a narrower wildcard under a ported binding keeps its port", allow: []string{"*.eu.svc.example.com"}, secrets: []string{"SVC_TOKEN=*.eu.svc.example.com:443"}},
		{name: "the bound port of a name under a ported binding", allow: []string{"api.svc.example.com:443"}, secrets: []string{"SVC_TOKEN=api.svc.example.com:443"}},
		{name: "another port of a name under a ported binding", allow: []string{"api.svc.example.com:8443"}},
		{name: "another port of a ported binding's own wildcard", allow: []string{"*.svc.example.com:8443"}},
		{name: "another host", allow: []string{"evil.example.net"}, widens: true},
		{name: "the wildcard's own name", allow: []string{"files.example.com"}, widens: true},
		{name: "a wider wildcard", allow: []string{"*.example.com"}, widens: true},
		{name: "any port of a host allowed on one", allow: []string{"packages.example.com"}, widens: true},
		{name: "another port", allow: []string{"packages.example.com:80"}, widens: true},
		{name: "another port of the IP literal", allow: []string{"198.18.0.5:22"}, widens: true},
		{name: "a name for the IP literal's port", allow: []string{"api.example.com:8080", "localhost:8080"}, widens: true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			got, err := egress.Narrow(profile, tt.allow)
			if tt.widens {
				if !errors.Is(err, egress.ErrWiden) {
					t.Fatalf("Narrow(%q) = %v, want ErrWiden", tt.allow, err)
				}
				return
			}
			if err != nil {
				t.Fatalf("Narrow(%q): %v", tt.allow, err)
			}
			if !slices.Equal(got.Allow, tt.allow) {
				t.Errorf("allow %q, want %q", got.Allow, tt.allow)
			}
			var secrets []string
			for _, s := range got.Secrets {
				h := ""
				for i, x := range s.Hosts {
					if i > 0 {
						h += ","
					}
					h += x
				}
				secrets = append(secrets, s.Env+"="+h)
			}
			if !slices.Equal(secrets, tt.secrets) {
				t.Errorf("secrets %q, want %q", secrets, tt.secrets)
			}
			if _, err := egress.New(egress.Config{}, got); err != nil {
				t.Errorf("the narrowed policy is refused: %v", err)
			}
		})
	}
	if _, err := egress.Narrow(profile, []string{"*.com:x"}); !errors.Is(err, egress.ErrInvalidPolicy) {
		t.Errorf("a bad entry: %v, want ErrInvalidPolicy", err)
	}
}
