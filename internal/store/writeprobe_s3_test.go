//go:build integration

package store_test

import (
	"bytes"
	"errors"
	"strings"
	"testing"

	"github.com/boxcar-run/boxcar/internal/store"
	"github.com/boxcar-run/boxcar/internal/store/s3test"
)

// TestTenantProbeFindsItsFolderRefused: on a real S3 server whose bucket policy refuses the
// worker's account every write under one tenant's folder, the Probe of that tenant's store
// fails with ErrWriteRefused, naming the folder and the permission to grant, while the shared
// store's probe and another tenant's pass; the refused tenant's List shows nothing of the
// proof, nor does the allowed one's.
func TestTenantProbeFindsItsFolderRefused(t *testing.T) {
	t.Parallel()
	shared := refusingStore(t, "boxcar", "boxcar/"+store.TenantPrefix("team-b"))
	ctx := t.Context()
	if err := store.Probe(ctx, shared); err != nil {
		t.Fatalf("the shared store's probe: %v", err)
	}
	allowed, refused := store.ForTenant(shared, "team-a"), store.ForTenant(shared, "team-b")
	if err := store.Probe(ctx, allowed); err != nil {
		t.Errorf("team-a's probe: %v", err)
	}
	err := store.Probe(ctx, refused)
	t.Logf("team-b's probe: %v", err)
	if !errors.Is(err, store.ErrWriteRefused) {
		t.Fatalf("team-b's probe = %v, want ErrWriteRefused", err)
	}
	for _, want := range []string{"s3://" + scopedBucket + "/boxcar/tenants/team-b/", "s3:PutObject on arn:aws:s3:::" + scopedBucket + "/boxcar/tenants/team-b/*"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("the refusal does not say %q", want)
		}
	}
	for _, st := range []store.Store{allowed, refused} {
		if objs, err := st.List(ctx, ""); err != nil || len(objs) != 0 {
			t.Errorf("%s lists %v, %v; want nothing", st.URL(""), objs, err)
		}
	}
}

// TestPutOnceRefusedIsNotMaybeStored: on a real S3 server whose bucket policy refuses the
// worker's account writes under a folder, a create-only put there, of one part or of several,
// fails with ErrWriteRefused and not ErrMaybeStored: the server's AccessDenied took nothing, so
// a caller neither puts again until its deadline nor keeps what the object would name. Before,
// the one-part put, whose body the client had read whole, was "may or may not be stored".
func TestPutOnceRefusedIsNotMaybeStored(t *testing.T) {
	t.Parallel()
	st := refusingStore(t, "", "runs/j1/")
	for _, size := range []int{100, store.DefaultPartSize + 1} {
		body := bytes.Repeat([]byte("x"), size)
		_, err := store.PutOnce(t.Context(), st, "runs/j1/report.md", bytes.NewReader(body), int64(size))
		t.Logf("%d bytes: %v", size, err)
		if !errors.Is(err, store.ErrWriteRefused) || errors.Is(err, store.ErrMaybeStored) || !strings.Contains(err.Error(), "AccessDenied") {
			t.Errorf("PutOnce of %d bytes under the refused folder = %v, want ErrWriteRefused, not ErrMaybeStored, saying AccessDenied", size, err)
		}
		if _, err := store.PutOnce(t.Context(), st, "runs/j2/report.md", bytes.NewReader(body), int64(size)); err != nil && !errors.Is(err, store.ErrExists) {
			t.Errorf("PutOnce of %d bytes beside it: %v", size, err)
		}
	}
}

// scopedBucket is the bucket of refusingStore.
const scopedBucket = "boxcar-scoped"

// refusingStore is the store under prefix of scopedBucket, on a versitygw of its own, as the
// account "worker", which owns the bucket and whose writes under refused (a folder of the
// bucket, not of the store) the bucket's policy refuses: an operator scoping IAM by prefix.
func refusingStore(t *testing.T, prefix, refused string) *store.S3 {
	t.Helper()
	srv := s3test.StartIAM(t)
	secret := srv.CreateUser(t, "worker")
	srv.CreateOwnedBucket(t, "worker", scopedBucket)
	srv.DenyWritesUnder(t, scopedBucket, "worker", refused)
	vars := srv.UserVars("worker", secret)
	return newS3(t, srv, scopedBucket, prefix, store.Options{Getenv: func(k string) string { return vars[k] }})
}
