package config_test

import (
	"errors"
	"reflect"
	"strings"
	"testing"

	"github.com/boxcar-run/boxcar/internal/config"
	"github.com/boxcar-run/boxcar/internal/job"
)

// twoProfiles is a config with profiles p and q, and the tenants section given.
func twoProfiles(tenants string) string {
	return profile("") + "  q:\n    model: {name: m}\n    tools: [{name: read_file}]\n" + tenants
}

// TestTenantsParse: a tenants: section reads with its defaults, and without one the worker
// serves one tenant, default, granted every profile.
func TestTenantsParse(t *testing.T) {
	tests := []struct {
		name string
		yaml string
		want map[string]config.Tenant
	}{
		{name: "none: default gets every profile", yaml: twoProfiles(""),
			want: map[string]config.Tenant{job.DefaultTenant: {Profiles: []string{"p", "q"}, MaxConcurrent: 64}}},
		{name: "two tenants", yaml: twoProfiles("nats: {max_ack_pending: 10}\ntenants:\n  team-a: {profiles: [p], max_concurrent: 4, daily_tokens: 2000000}\n  b: {profiles: [p, q]}\n"),
			want: map[string]config.Tenant{
				"team-a": {Profiles: []string{"p"}, MaxConcurrent: 4, DailyTokens: 2000000},
				"b":      {Profiles: []string{"p", "q"}, MaxConcurrent: 10},
			}},
		{name: "own bucket", yaml: "store: {url: s3://shared/boxcar}\n" + twoProfiles("tenants:\n  a: {profiles: [q], bucket: boxcar-a}\n"),
			want: map[string]config.Tenant{"a": {Profiles: []string{"q"}, MaxConcurrent: 64, Bucket: "boxcar-a"}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg, err := config.Parse([]byte(tt.yaml))
			if err != nil {
				t.Fatal(err)
			}
			if got := cfg.TenantsOrDefault(); !reflect.DeepEqual(got, tt.want) {
				t.Errorf("tenants = %+v, want %+v", got, tt.want)
			}
		})
	}
}

// TestInvalidTenantsNameTheField: each mistake in a tenants: section is placed at its key, says
// what is wrong and, for a misspelt profile or key, what was meant.
func TestInvalidTenantsNameTheField(t *testing.T) {
	tests := []struct {
		name, tenants string
		path          string
		line, col     int
		says          string
	}{
		{"misspelt profile", "tenants:\n  a: {profiles: [p, qq]}\n", "tenants.a.profiles[1]", 9, 21, `did you mean "q"?`},
		{"unknown profile", "tenants:\n  a: {profiles: [report-writer]}\n", "tenants.a.profiles[0]", 9, 18, "keys here: p, q"},
		{"misspelt key", "tenants:\n  a: {profiles: [p], max_concurent: 2}\n", "tenants.a.max_concurent", 9, 22, `did you mean "max_concurrent"?`},
		{"no profiles", "tenants:\n  a: {daily_tokens: 5}\n", "tenants.a.profiles", 9, 6, "grants nothing"},
		{"name with a dot", "tenants:\n  team.a: {profiles: [p]}\n", "tenants.team.a", 9, 11, "not a tenant name"},
		{"name uppercase", "tenants:\n  Team: {profiles: [p]}\n", "tenants.Team", 9, 9, "not a tenant name"},
		{"negative tokens", "tenants:\n  a: {profiles: [p], daily_tokens: -1}\n", "tenants.a.daily_tokens", 9, 36, "must not be negative"},
		{"negative concurrency", "tenants:\n  a: {profiles: [p], max_concurrent: -2}\n", "tenants.a.max_concurrent", 9, 38, "must not be negative"},
		{"tokens a string", "tenants:\n  a: {profiles: [p], daily_tokens: lots}\n", "tenants.a.daily_tokens", 9, 36, "integer"},
		{"bucket on a file store", "store: {url: 'file:///srv/boxcar'}\ntenants:\n  a: {profiles: [p], bucket: boxcar-a}\n", "tenants.a.bucket", 10, 30, "needs an s3:// store.url"},
		{"bucket not a name", "tenants:\n  a: {profiles: [p], bucket: Boxcar_A}\n", "tenants.a.bucket", 9, 30, "not an S3 bucket name"},
		{"bucket shared", "tenants:\n  a: {profiles: [p], bucket: bb-1}\n  b: {profiles: [p], bucket: bb-1}\n", "tenants.b.bucket", 10, 30, "tenant a's bucket too"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			yaml := twoProfiles(tt.tenants)
			_, err := config.Parse([]byte(yaml))
			if !errors.Is(err, config.ErrInvalid) {
				t.Fatalf("Parse: %v, want ErrInvalid\n%s", err, yaml)
			}
			fes := fieldErrors(t, err)
			if len(fes) != 1 {
				t.Fatalf("%d problems, want 1: %v", len(fes), err)
			}
			fe := fes[0]
			if fe.Path != tt.path || fe.Line != tt.line || fe.Column != tt.col || !strings.Contains(fe.Msg, tt.says) {
				t.Errorf("got %s %d:%d %q\nwant %s %d:%d saying %q\n%s", fe.Path, fe.Line, fe.Column, fe.Msg, tt.path, tt.line, tt.col, tt.says, yaml)
			}
		})
	}
}

// TestGrant: a job's tenant and profile are checked together, each refusal with its sentinel.
func TestGrant(t *testing.T) {
	cfg, err := config.Parse([]byte(twoProfiles("tenants:\n  a: {profiles: [p]}\n  b: {profiles: [p, q]}\n")))
	if err != nil {
		t.Fatal(err)
	}
	implicit, err := config.Parse([]byte(twoProfiles("")))
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name            string
		cfg             config.Config
		tenant, profile string
		want            error
	}{
		{"granted", cfg, "a", "p", nil},
		{"granted to the other", cfg, "b", "q", nil},
		{"not granted", cfg, "a", "q", config.ErrProfileNotGranted},
		{"unknown tenant", cfg, "c", "p", config.ErrUnknownTenant},
		{"default tenant not configured", cfg, job.DefaultTenant, "p", config.ErrUnknownTenant},
		{"unknown profile", cfg, "a", "r", config.ErrUnknownProfile},
		{"implicit default", implicit, job.DefaultTenant, "q", nil},
		{"implicit, other tenant", implicit, "a", "p", config.ErrUnknownTenant},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, p, err := tt.cfg.Grant(tt.tenant, tt.profile)
			if !errors.Is(err, tt.want) || (tt.want == nil) != (err == nil) {
				t.Fatalf("Grant(%s, %s) = %v, want %v", tt.tenant, tt.profile, err, tt.want)
			}
			if err == nil && p.Model.Name != "m" {
				t.Errorf("profile %+v, want the config's", p)
			}
		})
	}
}
