//go:build integration

package tenancy

import (
	"bytes"
	"context"
	"errors"
	"io"
	"strings"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/aws/smithy-go"

	"github.com/boxcar-run/boxcar/internal/store/s3test"
)

// tenantStore is versitygw with one account and one bucket per tenant (tenants.T.bucket), the
// worker holding the root account.
type tenantStore struct {
	srv     *s3test.Server
	buckets map[string]string // tenant -> bucket
	secrets map[string]string // tenant -> its account's secret key
}

func startTenantStore(t *testing.T) *tenantStore {
	t.Helper()
	ts := &tenantStore{srv: s3test.StartIAM(t), buckets: map[string]string{}, secrets: map[string]string{}}
	for _, tn := range tenants {
		ts.secrets[tn] = ts.srv.CreateUser(t, tn)
		ts.buckets[tn] = "boxcar-" + tn
		ts.srv.CreateOwnedBucket(t, tn, ts.buckets[tn])
	}
	return ts
}

// client is an S3 client with a tenant's account, or the root account for "worker".
func (ts *tenantStore) client(who string) *s3.Client {
	access, secret := ts.srv.AccessKey, ts.srv.SecretKey
	if who != "worker" {
		access, secret = who, ts.secrets[who]
	}
	return s3.New(s3.Options{
		Region: s3test.Region, BaseEndpoint: aws.String(ts.srv.Endpoint), UsePathStyle: true,
		Credentials: credentials.NewStaticCredentialsProvider(access, secret, ""),
	})
}

// accessDenied reports whether S3 refused the request for want of permission.
func accessDenied(err error) bool {
	var api smithy.APIError
	return errors.As(err, &api) && (api.ErrorCode() == "AccessDenied" || strings.Contains(api.ErrorCode(), "Forbidden"))
}

// TestStoreKeepsTenantsApart: with one versitygw account and bucket per tenant, a tenant's
// credentials read and write its own inputs and runs, while every attempt on the other
// tenant's (read an input, learn whether an input exists, list or read its runs, plant an
// input, delete a manifest) is refused; the worker's account reaches both.
func TestStoreKeepsTenantsApart(t *testing.T) {
	t.Parallel()
	ts := startTenantStore(t)
	ctx := t.Context()
	const input = "tenants/team-b/inputs/sha256/5f70bf18a086007016e948b04aed3b82103a36bea41755b6cddfaf10ace3c6ef"
	const manifest = "tenants/team-b/runs/20261204t150000-bbbbbbbbbbbb/manifest.json"
	worker := ts.client("worker")
	for _, key := range []string{input, manifest} {
		if _, err := worker.PutObject(ctx, &s3.PutObjectInput{Bucket: aws.String(ts.buckets["team-b"]), Key: aws.String(key), Body: strings.NewReader("team-b's")}); err != nil {
			t.Fatalf("the worker writes team-b's %s: %v", key, err)
		}
	}
	own := ts.client("team-a")
	ownKey := "tenants/team-a/inputs/sha256/aaaa"
	if _, err := own.PutObject(ctx, &s3.PutObjectInput{Bucket: aws.String(ts.buckets["team-a"]), Key: aws.String(ownKey), Body: strings.NewReader("mine")}); err != nil {
		t.Fatalf("team-a uploads its input: %v", err)
	}
	if out, err := own.GetObject(ctx, &s3.GetObjectInput{Bucket: aws.String(ts.buckets["team-a"]), Key: aws.String(ownKey)}); err != nil {
		t.Fatalf("team-a reads its input: %v", err)
	} else {
		out.Body.Close()
	}

	b := aws.String(ts.buckets["team-b"])
	attempts := []struct {
		name string
		try  func(ctx context.Context, c *s3.Client) error
	}{
		{"tenant reads another tenant's input", func(ctx context.Context, c *s3.Client) error {
			out, err := c.GetObject(ctx, &s3.GetObjectInput{Bucket: b, Key: aws.String(input)})
			if err == nil {
				_, _ = io.Copy(io.Discard, out.Body)
				out.Body.Close()
			}
			return err
		}},
		{"tenant learns whether another tenant has an input (existence oracle)", func(ctx context.Context, c *s3.Client) error {
			_, err := c.HeadObject(ctx, &s3.HeadObjectInput{Bucket: b, Key: aws.String(input)})
			return err
		}},
		{"tenant lists another tenant's runs", func(ctx context.Context, c *s3.Client) error {
			_, err := c.ListObjectsV2(ctx, &s3.ListObjectsV2Input{Bucket: b, Prefix: aws.String("tenants/team-b/runs/")})
			return err
		}},
		{"tenant reads another tenant's run manifest", func(ctx context.Context, c *s3.Client) error {
			out, err := c.GetObject(ctx, &s3.GetObjectInput{Bucket: b, Key: aws.String(manifest)})
			if err == nil {
				out.Body.Close()
			}
			return err
		}},
		{"tenant plants an input in another tenant's store", func(ctx context.Context, c *s3.Client) error {
			_, err := c.PutObject(ctx, &s3.PutObjectInput{Bucket: b, Key: aws.String("tenants/team-b/inputs/sha256/0000"), Body: bytes.NewReader([]byte("planted"))})
			return err
		}},
		{"tenant deletes another tenant's run manifest", func(ctx context.Context, c *s3.Client) error {
			_, err := c.DeleteObject(ctx, &s3.DeleteObjectInput{Bucket: b, Key: aws.String(manifest)})
			return err
		}},
	}
	for _, a := range attempts {
		t.Run(a.name, func(t *testing.T) {
			if err := a.try(ctx, own); !accessDenied(err) {
				t.Errorf("team-a's account: %v; want AccessDenied", err)
			}
		})
	}
	// The refused attempts changed nothing: the worker still reads team-b's manifest, and the
	// planted input is not there.
	if out, err := worker.GetObject(ctx, &s3.GetObjectInput{Bucket: b, Key: aws.String(manifest)}); err != nil {
		t.Errorf("team-b's manifest after the attempts: %v", err)
	} else {
		out.Body.Close()
	}
	if _, err := worker.HeadObject(ctx, &s3.HeadObjectInput{Bucket: b, Key: aws.String("tenants/team-b/inputs/sha256/0000")}); err == nil {
		t.Error("the planted input is in team-b's store")
	}
}
