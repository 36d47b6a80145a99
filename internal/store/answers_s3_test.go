//go:build integration

package store_test

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/boxcar-run/boxcar/internal/store"
	"github.com/boxcar-run/boxcar/internal/store/s3test"
)

// TestAnswersThatTakeNothingAreSorted: on a real S3 server, a create-only put that the server
// answers with a refusal storing nothing, after the store was proven (the bucket deleted, the
// worker's secret key changed or its account removed, within a probe interval), is neither
// "may or may not be stored" nor a refusal of the tenant's folder: it is the worker's
// (ErrWorkerRefused), waited for as the store's outage and saying what to change. The same
// answer for a bucket of the tenant's own (tenants.T.bucket) is that tenant's refusal
// (ErrWriteRefused); and a store whose own probe object is refused is the worker's, not the
// tenant's folder's, however the write that met it was addressed.
func TestAnswersThatTakeNothingAreSorted(t *testing.T) {
	t.Parallel()
	srv := s3test.StartIAM(t)
	type row struct {
		name   string
		own    bool // the store is a bucket of the tenant's own
		break_ func(t *testing.T, access, bucket string)
		code   string // the server's answer, in the error
		says   string // the remedy, in the error
	}
	removeBucket := func(t *testing.T, _, bucket string) {
		if err := os.RemoveAll(filepath.Join(srv.Dir, bucket)); err != nil {
			t.Fatal(err)
		}
	}
	rows := []row{
		{name: "bucket removed", break_: removeBucket, code: "NoSuchBucket", says: "store.url"},
		{name: "own bucket removed", own: true, break_: removeBucket, code: "NoSuchBucket", says: "tenants.<name>.bucket"},
		{name: "secret key changed", break_: func(t *testing.T, access, _ string) { srv.ChangeSecret(t, access) }, code: "SignatureDoesNotMatch", says: "AWS_SECRET_ACCESS_KEY"},
		{name: "account removed", break_: func(t *testing.T, access, _ string) { srv.DeleteUser(t, access) }, code: "InvalidAccessKeyId", says: "AWS_ACCESS_KEY_ID"},
		{name: "probe object refused", code: "AccessDenied", says: store.ProbeKey,
			break_: func(t *testing.T, access, bucket string) {}},
		{name: "own bucket's probe object refused", own: true, code: "AccessDenied", says: store.ProbeKey,
			break_: func(t *testing.T, access, bucket string) {}},
	}
	for i, tt := range rows {
		t.Run(tt.name, func(t *testing.T) {
			access, bucket := "worker"+string(rune('a'+i)), "boxcar-answers-"+string(rune('a'+i))
			secret := srv.CreateUser(t, access)
			srv.CreateOwnedBucket(t, access, bucket)
			vars := srv.UserVars(access, secret)
			st := newS3(t, srv, bucket, "", store.Options{Getenv: func(k string) string { return vars[k] }})
			tenant := store.ForTenant(st, "team-b")
			if tt.own {
				tenant = store.ForTenantBucket(st, "team-b")
			}
			if tt.code == "AccessDenied" {
				srv.DenyWritesUnder(t, bucket, access, ".boxcar/") // before the first proof
			} else if err := store.Probe(t.Context(), tenant); err != nil {
				t.Fatalf("the proof before the answer changed: %v", err)
			}
			tt.break_(t, access, bucket)
			_, err := store.PutOnce(t.Context(), tenant, "runs/j1/manifest.json", bytes.NewReader([]byte("{}")), 2)
			t.Logf("PutOnce: %v", err)
			if errors.Is(err, store.ErrMaybeStored) {
				t.Errorf("an answer that stored nothing is %v", store.ErrMaybeStored)
			}
			if tt.own != errors.Is(err, store.ErrWriteRefused) || tt.own == errors.Is(err, store.ErrWorkerRefused) {
				t.Errorf("ErrWriteRefused %v, ErrWorkerRefused %v; want the tenant's refusal only for a bucket of its own (%v)",
					errors.Is(err, store.ErrWriteRefused), errors.Is(err, store.ErrWorkerRefused), tt.own)
			}
			if err == nil || !strings.Contains(err.Error(), tt.code) || !strings.Contains(err.Error(), tt.says) {
				t.Errorf("the error does not say %q and %q", tt.code, tt.says)
			}
		})
	}
}

// TestEveryWriteRefusedAfterTheProofIsTheWorkers: a policy that refuses the worker every write
// of the bucket, set after the store was proven and while that proof still holds, refuses every
// tenant alike: the write under a tenant's folder that meets it is the worker's refusal
// (ErrWorkerRefused), naming the store's probe object, not that tenant's (ErrWriteRefused,
// which fails its job store_write_refused).
func TestEveryWriteRefusedAfterTheProofIsTheWorkers(t *testing.T) {
	t.Parallel()
	srv := s3test.StartIAM(t)
	const access, bucket = "worker", "boxcar-revoked"
	secret := srv.CreateUser(t, access)
	srv.CreateOwnedBucket(t, access, bucket)
	vars := srv.UserVars(access, secret)
	st := newS3(t, srv, bucket, "", store.Options{Getenv: func(k string) string { return vars[k] }})
	tenant := store.ForTenant(st, "team-b")
	if err := store.Probe(t.Context(), tenant); err != nil {
		t.Fatalf("the proof before the policy: %v", err)
	}
	srv.DenyWritesUnder(t, bucket, access, "")
	_, err := store.PutOnce(t.Context(), tenant, "runs/j1/manifest.json", bytes.NewReader([]byte("{}")), 2)
	t.Logf("PutOnce: %v", err)
	if errors.Is(err, store.ErrWriteRefused) || !errors.Is(err, store.ErrWorkerRefused) || !strings.Contains(err.Error(), store.ProbeKey) {
		t.Errorf("ErrWriteRefused %v, ErrWorkerRefused %v; want the worker's refusal, naming %s",
			errors.Is(err, store.ErrWriteRefused), errors.Is(err, store.ErrWorkerRefused), store.ProbeKey)
	}
}
