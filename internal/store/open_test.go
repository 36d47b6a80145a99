package store_test

import (
	"errors"
	"path/filepath"
	"strings"
	"testing"

	"github.com/boxcar-run/boxcar/internal/store"
	"github.com/boxcar-run/boxcar/internal/store/s3test"
)

func TestOpen(t *testing.T) {
	s3test.IsolateEnv(t)
	t.Setenv("AWS_ACCESS_KEY_ID", "open-test")
	t.Setenv("AWS_SECRET_ACCESS_KEY", "open-test")
	dir := filepath.Join(t.TempDir(), "store")
	tests := []struct {
		name    string
		url     string
		wantURL string // URL("k") of the opened store
		wantErr error
	}{
		{name: "file", url: "file://" + dir, wantURL: "file://" + dir + "/k"},
		{name: "file localhost", url: "file://localhost" + dir + "/", wantURL: "file://" + dir + "/k"},
		{name: "s3 bucket", url: "s3://boxcar-results", wantURL: "s3://boxcar-results/k"},
		{name: "s3 prefix", url: "s3://boxcar-results/prod/eu/", wantURL: "s3://boxcar-results/prod/eu/k"},
		{name: "relative path", url: "relative/store", wantErr: store.ErrInvalidURL},
		{name: "file with a host", url: "file://relative/store", wantErr: store.ErrInvalidURL},
		{name: "opaque file", url: "file:relative", wantErr: store.ErrInvalidURL},
		{name: "unknown scheme", url: "ftp://host/store", wantErr: store.ErrInvalidURL},
		{name: "no bucket", url: "s3:///prefix", wantErr: store.ErrInvalidURL},
		{name: "bad bucket", url: "s3://Bad_Bucket", wantErr: store.ErrInvalidURL},
		{name: "climbing prefix", url: "s3://boxcar-results/a/../../b", wantErr: store.ErrInvalidURL},
		{name: "query", url: "s3://boxcar-results?token=x", wantErr: store.ErrInvalidURL},
		{name: "credentials", url: "s3://AKIDEXAMPLE:sk-test-SECRET@boxcar-results/p", wantErr: store.ErrInvalidURL},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			st, err := store.Open(t.Context(), tt.url, store.Options{Endpoint: "http://127.0.0.1:9", PathStyle: true})
			if !errors.Is(err, tt.wantErr) {
				t.Fatalf("Open(%q) error = %v, want %v", tt.url, err, tt.wantErr)
			}
			if err != nil {
				if st != nil {
					t.Errorf("Open(%q) returned a store with its error", tt.url)
				}
				if strings.Contains(err.Error(), "sk-test-SECRET") || strings.Contains(err.Error(), "AKIDEXAMPLE") || strings.Contains(err.Error(), "token=") {
					t.Errorf("Open(%q) error repeats a credential: %v", tt.url, err)
				}
				return
			}
			defer st.Close()
			if got := st.URL("k"); got != tt.wantURL {
				t.Errorf("URL(k) = %q, want %q", got, tt.wantURL)
			}
		})
	}
}
