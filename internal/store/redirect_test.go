package store_test

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/boxcar-run/boxcar/internal/store"
	"github.com/boxcar-run/boxcar/test/harness"
)

// TestS3FollowsNoRedirect: an S3 store follows no redirect, with the SDK's own client or one
// the caller gives (a private CA's, as the worker and submit make): Go's client would resend
// the signed request's Authorization to the same host on another port, and its session token
// (X-Amz-Security-Token, a header Go does not know as secret) to any address. Two loopback
// origins on ports of their own: the endpoint redirects every request to the other.
func TestS3FollowsNoRedirect(t *testing.T) {
	endpoint, other := harness.RedirectingOrigins(t, http.StatusTemporaryRedirect, "Authorization", "X-Amz-Security-Token")
	env := map[string]string{"AWS_ACCESS_KEY_ID": "AKIDREDIRECT", "AWS_SECRET_ACCESS_KEY": "secret-redirect",
		"AWS_SESSION_TOKEN": "session-token-redirect", "AWS_REGION": "us-east-1", "AWS_EC2_METADATA_DISABLED": "true",
		"AWS_CONFIG_FILE": "/nonexistent", "AWS_SHARED_CREDENTIALS_FILE": "/nonexistent"}
	for _, tt := range []struct {
		name   string
		client *http.Client
	}{
		{"the SDK's client", nil},
		{"the caller's client", &http.Client{Transport: &http.Transport{}}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
			defer cancel()
			st, err := store.Open(ctx, "s3://bucket", store.Options{Endpoint: endpoint.URL, PathStyle: true, HTTPClient: tt.client,
				MaxAttempts: 1, Getenv: func(k string) string { return env[k] }})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = st.Close() })
			_, err = st.Stat(ctx, "k")
			if got := other.Take(); len(got) > 0 {
				t.Errorf("the redirect was followed (Stat: %v): the other server got %s", err, strings.Join(got, "; "))
			}
			if err == nil {
				t.Error("Stat of a redirected request succeeded; want an error")
			}
		})
	}
}
