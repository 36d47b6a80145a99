package store

import (
	"context"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestS3ErrorsHoldNoCredentials: what the store's errors say reaches the worker's log, /readyz
// and a job's status, so no credential the AWS SDK was given, or read from a credential_process,
// may appear in one, however the store fails.
func TestS3ErrorsHoldNoCredentials(t *testing.T) {
	const (
		id     = "AKIAREALACCESSKEY1"
		secret = "real-secret-access-key-0123456789"
		token  = "real-session-token-0123456789"
	)
	// The server refuses every request, as a store with revoked credentials does.
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusForbidden)
		_, _ = w.Write([]byte(`<Error><Code>AccessDenied</Code><Message>Access Denied</Message></Error>`))
	}))
	defer srv.Close()
	dir := t.TempDir()
	// process is a profile whose credential_process prints out.
	process := func(name, out string) map[string]string {
		script := filepath.Join(dir, name+".sh")
		if err := os.WriteFile(script, []byte("#!/bin/sh\ncat <<'EOF'\n"+out+"\nEOF\n"), 0o700); err != nil {
			t.Fatal(err)
		}
		cfg := filepath.Join(dir, name+".config")
		if err := os.WriteFile(cfg, []byte("[default]\ncredential_process = "+script+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		return map[string]string{"AWS_CONFIG_FILE": cfg, "AWS_SHARED_CREDENTIALS_FILE": cfg, "AWS_EC2_METADATA_DISABLED": "true"}
	}
	creds := `"AccessKeyId":"` + id + `","SecretAccessKey":"` + secret + `","SessionToken":"` + token + `"`
	tests := []struct {
		name     string
		env      map[string]string
		endpoint string
	}{
		{name: "static credentials refused", env: map[string]string{"AWS_ACCESS_KEY_ID": id, "AWS_SECRET_ACCESS_KEY": secret, "AWS_SESSION_TOKEN": token}},
		{name: "credentials in the endpoint", env: map[string]string{"AWS_ACCESS_KEY_ID": "other", "AWS_SECRET_ACCESS_KEY": "other"},
			endpoint: strings.Replace(srv.URL, "://", "://"+id+":"+secret+"@", 1)},
		// The SDK quotes the whole output of a credential_process it cannot parse.
		{name: "credential_process with a bad expiration", env: process("expiration", `{"Version":1,`+creds+`,"Expiration":"tomorrow"}`)},
		{name: "credential_process with a warning first", env: process("warning", "warning: cache is stale\n{\"Version\":1,"+creds+"}")},
		{name: "credential_process with truncated output", env: process("truncated", `{"Version":1,`+creds)},
		{name: "credential_process of another version", env: process("version", `{"Version":2,`+creds+`}`)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			endpoint := tt.endpoint
			if endpoint == "" {
				endpoint = srv.URL
			}
			s, err := NewS3(t.Context(), "bucket", "p", Options{Endpoint: endpoint, PathStyle: true, MaxAttempts: 1, Getenv: func(k string) string { return tt.env[k] }})
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			ops := map[string]func(ctx context.Context) error{
				"put":           func(ctx context.Context) error { return s.Put(ctx, "k", strings.NewReader("x"), 1) },
				"put-if-absent": func(ctx context.Context) error { return s.PutIfAbsent(ctx, "k", strings.NewReader("x"), 1) },
				"get":           func(ctx context.Context) error { _, err := s.Get(ctx, "k"); return err },
				"stat":          func(ctx context.Context) error { _, err := s.Stat(ctx, "k"); return err },
				"list":          func(ctx context.Context) error { _, err := s.List(ctx, ""); return err },
				"delete":        func(ctx context.Context) error { return s.Delete(ctx, "k") },
				"probe":         func(ctx context.Context) error { return Probe(ctx, s) },
			}
			for op, call := range ops {
				err := call(t.Context())
				if err == nil {
					t.Fatalf("%s: no error from a store that refuses everything", op)
				}
				for _, v := range []string{id, secret, token} {
					if strings.Contains(err.Error(), v) {
						t.Errorf("%s: error holds a credential (%.8s…): %v", op, v, err)
						break
					}
				}
			}
		})
	}
}
