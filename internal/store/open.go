package store

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"strings"
	"time"
)

// Options tune how Open and NewS3 reach a store. The zero value is ready to use; fields that
// only concern S3 are ignored by the file backend.
type Options struct {
	// Endpoint is the base URL of an S3-compatible service, such as http://127.0.0.1:7070.
	// Empty means AWS S3. S3 only.
	Endpoint string
	// Region signs S3 requests. Default: the SDK's chain (AWS_REGION, shared config), else
	// us-east-1. S3 only.
	Region string
	// PathStyle addresses buckets as a path (endpoint/bucket/key) instead of a host name, as
	// most S3-compatible servers want. Default: false (virtual-hosted style). S3 only.
	PathStyle bool
	// Logger receives the few events the store handles itself (an abandoned multipart upload
	// it could not abort). Default: discard.
	Logger *slog.Logger
	// HTTPClient sends S3 requests; its TLS settings are the caller's (AWS_CA_BUNDLE does not
	// apply to it), and Close leaves it alone. Its redirect policy is not used: the store
	// follows no redirect. Default: the SDK's transport settings (30s dial
	// timeout, keep-alive, AWS_CA_BUNDLE) in a client that Close releases. S3 only.
	HTTPClient *http.Client
	// MaxAttempts bounds the tries of one S3 request, the first included; the SDK retries
	// throttling, 5xx and connection errors with jittered exponential backoff. Default: 3.
	// S3 only.
	MaxAttempts int
	// AllowUnsafeOverwrite lets the s3 store run on a server that ignores If-None-Match, which
	// Probe otherwise refuses: create-only puts then overwrite, and a stale attempt can
	// replace a committed run. The config's store.allow_unsafe_overwrite. S3 only.
	AllowUnsafeOverwrite bool
	// ProbeInterval is how long a proof that the server refuses a second create-only put
	// holds (see Probe): within it PutIfAbsent and readiness reuse it, and after it the next
	// one proves it again, so a server that stops honouring If-None-Match is refused within
	// this long. Default: 1 minute. S3 only.
	ProbeInterval time.Duration
	// PartSize is the size of one part of a multipart upload, in bytes; bodies up to this size
	// go in one PutObject. At least 5 MiB. Default: 5 MiB. It bounds the memory one upload
	// holds. S3 only.
	PartSize int64
	// Getenv is the environment the AWS SDK's settings come from: AWS_ACCESS_KEY_ID,
	// AWS_SECRET_ACCESS_KEY, AWS_SESSION_TOKEN, AWS_REGION, AWS_PROFILE, AWS_CONFIG_FILE and
	// AWS_SHARED_CREDENTIALS_FILE (else $HOME/.aws/config and credentials), and
	// AWS_EC2_METADATA_DISABLED. Default: the process's environment, as the SDK reads it.
	// Credentials from other sources (web identity, containers, instance roles) still follow the
	// process's. S3 only.
	Getenv func(string) string
	// Submitter opens the store for submit, with a tenant's credentials, not a worker's: a
	// refusal is then the submitter's, said so (ForTenant), and is not told whose it is by
	// proving the store's own object or writing a key again in no tenant's folder, which only
	// a worker's credentials may.
	Submitter bool
}

// Open returns the store rawURL names: file:///abs/path for a local directory (created if
// missing) or s3://bucket[/prefix] for a bucket of an S3-compatible service, with credentials
// from the AWS SDK's standard chain (AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, shared files,
// web identity, instance roles). Close the store when done with it. Errors about the URL wrap
// ErrInvalidURL.
func Open(ctx context.Context, rawURL string, opts Options) (Store, error) {
	u, err := url.Parse(rawURL)
	if err != nil {
		// url.Parse quotes the whole input; it may hold credentials, so name only the problem.
		return nil, fmt.Errorf("store: open: %w: not a URL", ErrInvalidURL)
	}
	// Errors name the URL without user info or query, which could hold credentials.
	name := u.Scheme + "://" + u.Host + u.Path
	if u.User != nil {
		return nil, fmt.Errorf("store: open %s: %w: credentials do not belong in the URL; use AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY", name, ErrInvalidURL)
	}
	if u.RawQuery != "" || u.Fragment != "" || u.Opaque != "" {
		return nil, fmt.Errorf("store: open %s: %w: query, fragment or opaque part not allowed", name, ErrInvalidURL)
	}
	switch u.Scheme {
	case "file":
		if u.Host != "" && u.Host != "localhost" {
			return nil, fmt.Errorf("store: open %s: %w: a file URL names a local path, file:///abs/path", name, ErrInvalidURL)
		}
		if !strings.HasPrefix(u.Path, "/") {
			return nil, fmt.Errorf("store: open %s: %w: the path must be absolute, file:///abs/path", name, ErrInvalidURL)
		}
		f, err := NewFile(u.Path)
		if err != nil {
			return nil, err // not a typed nil in the interface
		}
		f.probe.submitter = opts.Submitter
		return f, nil
	case "s3":
		if u.Host == "" {
			return nil, fmt.Errorf("store: open %s: %w: no bucket; use s3://bucket[/prefix]", name, ErrInvalidURL)
		}
		s, err := NewS3(ctx, u.Host, strings.Trim(u.Path, "/"), opts)
		if err != nil {
			return nil, err
		}
		return s, nil
	default:
		return nil, fmt.Errorf("store: open %s: %w: scheme %q is not supported; use file:///abs/path or s3://bucket[/prefix]", name, ErrInvalidURL, u.Scheme)
	}
}
