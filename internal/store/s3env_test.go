package store

import (
	"path/filepath"
	"strings"
	"testing"
)

// TestS3SettingsComeFromGetenv: a store given an environment takes its credentials, region and
// shared files from it, not from the process's, so tests with their own credentials run side
// by side in one process.
func TestS3SettingsComeFromGetenv(t *testing.T) {
	t.Setenv("AWS_ACCESS_KEY_ID", "process-key")
	t.Setenv("AWS_SECRET_ACCESS_KEY", "process-secret")
	t.Setenv("AWS_REGION", "process-region")
	home := t.TempDir()
	tests := []struct {
		name       string
		env        map[string]string
		wantKey    string
		wantRegion string
	}{
		{name: "injected", env: map[string]string{"AWS_ACCESS_KEY_ID": "env-key", "AWS_SECRET_ACCESS_KEY": "env-secret", "AWS_REGION": "eu-west-3", "HOME": home},
			wantKey: "env-key", wantRegion: "eu-west-3"},
		{name: "default region", env: map[string]string{"AWS_ACCESS_KEY_ID": "env-key", "AWS_SECRET_ACCESS_KEY": "s", "AWS_DEFAULT_REGION": "ap-south-1", "AWS_CONFIG_FILE": filepath.Join(home, "none")},
			wantKey: "env-key", wantRegion: "ap-south-1"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s, err := NewS3(t.Context(), "bucket", "", Options{Getenv: func(k string) string { return tt.env[k] }})
			if err != nil {
				t.Fatal(err)
			}
			o := s.client.Options()
			creds, err := o.Credentials.Retrieve(t.Context())
			if err != nil {
				t.Fatal(err)
			}
			if creds.AccessKeyID != tt.wantKey || o.Region != tt.wantRegion {
				t.Errorf("key %q, region %q; want %q, %q", creds.AccessKeyID, o.Region, tt.wantKey, tt.wantRegion)
			}
		})
	}
}

// TestS3RefusesHalfAKeyPair: static credentials come from two variables; with one of them
// unset or empty the store is refused when it opens, naming both variables and neither value
// (the SDK said "static credentials are empty" at the first request, naming neither, or read
// other credentials in silence).
func TestS3RefusesHalfAKeyPair(t *testing.T) {
	t.Parallel()
	const id, secret = "AKIAHALFPAIRMARKER01", "half-pair-secret-marker"
	tests := []struct {
		name string
		env  map[string]string
	}{
		{"secret not set", map[string]string{"AWS_ACCESS_KEY_ID": id}},
		{"secret empty", map[string]string{"AWS_ACCESS_KEY_ID": id, "AWS_SECRET_ACCESS_KEY": ""}},
		{"key id not set", map[string]string{"AWS_SECRET_ACCESS_KEY": secret}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			_, err := NewS3(t.Context(), "bucket", "", Options{Getenv: func(k string) string { return tt.env[k] }})
			if err == nil {
				t.Fatal("NewS3 accepted half a key pair")
			}
			for _, w := range []string{"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"} {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("the error %q does not name %s", err, w)
				}
			}
			if strings.Contains(err.Error(), id) || strings.Contains(err.Error(), secret) {
				t.Errorf("the error holds a value: %v", err)
			}
		})
	}
}
