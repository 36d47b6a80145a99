//go:build integration

package store_test

import (
	"bytes"
	"errors"
	"maps"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/boxcar-run/boxcar/internal/store"
	"github.com/boxcar-run/boxcar/internal/store/s3test"
)

// ownedStore is a store of bucket, on srv, as a new account that owns it: the account's
// policy (s3test.Deny) refuses it what the test says, the root user keeps every right.
func ownedStore(t *testing.T, srv *s3test.Server, access, bucket string) *store.S3 {
	t.Helper()
	return ownedStoreWith(t, srv, access, bucket, store.Options{})
}

// ownedStoreWith is ownedStore with opts.
func ownedStoreWith(t *testing.T, srv *s3test.Server, access, bucket string, opts store.Options) *store.S3 {
	t.Helper()
	secret := srv.CreateUser(t, access)
	srv.CreateOwnedBucket(t, access, bucket)
	vars := srv.UserVars(access, secret)
	opts.Getenv = func(k string) string { return vars[k] }
	return newS3(t, srv, bucket, "", opts)
}

// TestStatInMissingBucketIsTheBucketGone: S3 answers a HEAD with a status and no body, so a
// HEAD of a key in a bucket that is gone is a 404 like a HEAD of a missing key. A stat of the
// manifest there is not "not committed" (ErrNotFound): it is the bucket gone, the worker's
// refusal on the shared store (ErrWorkerRefused), the tenant's on a bucket of its own
// (ErrWriteRefused), saying NoSuchBucket; a missing key in a bucket that is there stays
// ErrNotFound. A bucket found holds for a tenth of the probe interval (10 ms here, so that
// the stat after its removal asks again).
func TestStatInMissingBucketIsTheBucketGone(t *testing.T) {
	t.Parallel()
	srv := s3test.StartIAM(t)
	for i, own := range []bool{false, true} {
		access, bucket := "stat"+string(rune('a'+i)), "boxcar-stat-"+string(rune('a'+i))
		st := ownedStoreWith(t, srv, access, bucket, store.Options{ProbeInterval: 10 * time.Millisecond})
		tenant := store.ForTenant(st, "team-b")
		if own {
			tenant = store.ForTenantBucket(st, "team-b")
		}
		if _, err := tenant.Stat(t.Context(), store.ManifestKey("j1")); !errors.Is(err, store.ErrNotFound) {
			t.Fatalf("own bucket %v: stat of a missing key in the bucket = %v, want ErrNotFound", own, err)
		}
		if err := os.RemoveAll(filepath.Join(srv.Dir, bucket)); err != nil {
			t.Fatal(err)
		}
		time.Sleep(10 * time.Millisecond) // past the hold of the bucket found
		_, err := tenant.Stat(t.Context(), store.ManifestKey("j1"))
		t.Logf("own bucket %v: %v", own, err)
		if errors.Is(err, store.ErrNotFound) || own != errors.Is(err, store.ErrWriteRefused) || own == errors.Is(err, store.ErrWorkerRefused) ||
			!strings.Contains(err.Error(), "NoSuchBucket") {
			t.Errorf("own bucket %v: stat in the removed bucket = %v; want the bucket gone (NoSuchBucket), the tenant's only for its own", own, err)
		}
	}
}

// TestReadRefusedSaysWhose: a policy refusing the worker reads (GetObject, which HEAD is
// authorized by too) of one input is that input's refusal (ErrReadRefused, naming the key and
// the permission), while the store's own object reads; one refusing every read of the bucket is
// the worker's (ErrWorkerRefused). Before, both were an AccessDenied (a HEAD's bodiless 403
// "Forbidden") that the worker waited out as an outage. A policy on the key's name in every
// tenant's folder (tenants/*/inputs/*) refuses the same key in no tenant's folder too
// (tenants/.boxcar-probe/), and is the worker's: it failed every tenant's jobs input_refused.
// Each read is sorted by one proof of the store, one PUT and one GET of its own object: the
// read of the key in no tenant's folder, refused too, proved the store a second time, each
// retry of a job waiting on it.
func TestReadRefusedSaysWhose(t *testing.T) {
	t.Parallel()
	srv := s3test.StartIAM(t)
	input := store.InputKey(strings.Repeat("a", 64))
	rows := []struct {
		name     string
		resource string // of the Deny, under the bucket
		worker   bool   // the worker's refusal, else the key's
	}{
		{name: "one input", resource: store.TenantPrefix("team-b") + input},
		{name: "every key", resource: "*", worker: true},
		{name: "every tenant's inputs", resource: "tenants/*/inputs/*", worker: true},
	}
	for i, tt := range rows {
		access, bucket := "read"+string(rune('a'+i)), "boxcar-read-"+string(rune('a'+i))
		counted := &probeCounter{base: http.DefaultTransport.(*http.Transport).Clone(), by: map[string]int{}}
		t.Cleanup(counted.base.CloseIdleConnections)
		st := ownedStoreWith(t, srv, access, bucket, store.Options{HTTPClient: &http.Client{Transport: counted}})
		tenant := store.ForTenant(st, "team-b")
		if err := tenant.Put(t.Context(), input, bytes.NewReader([]byte("x")), 1); err != nil {
			t.Fatal(err)
		}
		if err := store.Probe(t.Context(), tenant); err != nil {
			t.Fatal(err)
		}
		srv.Deny(t, bucket, access, "s3:GetObject", tt.resource)
		reads := map[string]func() error{
			"get":  func() error { _, err := tenant.Get(t.Context(), input); return err },
			"stat": func() error { _, err := tenant.Stat(t.Context(), input); return err },
		}
		for op, read := range reads {
			counted.reset()
			err := read()
			t.Logf("%s: %s: %v", tt.name, op, err)
			if tt.worker != errors.Is(err, store.ErrWorkerRefused) || tt.worker == errors.Is(err, store.ErrReadRefused) {
				t.Errorf("%s: %s = %v; want the worker's refusal %v, else the key's (ErrReadRefused)", tt.name, op, err, tt.worker)
			}
			if !tt.worker && (err == nil || !strings.Contains(err.Error(), "s3:GetObject on arn:aws:s3:::"+bucket+"/"+store.TenantPrefix("team-b")+input)) {
				t.Errorf("%s: %s does not name the permission on the key", tt.name, op)
			}
			if got := counted.counts(); got[http.MethodPut] != 1 || got[http.MethodGet] != 1 || len(got) != 2 {
				t.Errorf("%s: %s sent %v to the store's own object %s; want one PUT and one GET", tt.name, op, got, store.ProbeKey)
			}
		}
		if objs, err := st.List(t.Context(), "tenants/.boxcar-probe/"); err != nil || len(objs) != 0 {
			t.Errorf("%s: the key's probe left %v, %v", tt.name, objs, err)
		}
	}
}

// TestKeyRefusedWhileItsFolderTakesWrites: a bucket policy refusing a key in a tenant's folder
// that takes the worker's writes (its proof passes) is told by the same key in no tenant's
// folder (tenants/.boxcar-probe/): a policy on the key's name in every tenant's folder
// (tenants/*/runs/*/manifest.json) refuses it there too, and is the worker's refusal
// (ErrWorkerRefused) on the shared store, the tenant's on its own bucket; a policy on this
// tenant's key alone is the tenant's (ErrWriteRefused), saying so. Each names the key's
// permission and the proof that took. Before, both were the tenant's folder's refusal, which
// failed every tenant's jobs store_write_refused for a policy on a name every run writes.
// A run's key of S3's longest (1,024 bytes) is told too: its probe is no longer than the key,
// the job's id cut short. Before, the probe was 7 bytes longer (tenants/.boxcar-probe/ for
// tenants/team-b/), too long for S3, and the refusal read as "cannot tell", waited out.
func TestKeyRefusedWhileItsFolderTakesWrites(t *testing.T) {
	t.Parallel()
	srv := s3test.StartIAM(t)
	const id = "20261207t230000-abcdef012345"
	// Segments of at most 200 bytes (versitygw keeps a key's folders as a file system's),
	// to 1,024 bytes with the tenant's folder.
	long := store.RunPrefix(id) + strings.Repeat(strings.Repeat("x", 199)+"/", 4)
	long += strings.Repeat("y", 1024-len(store.TenantPrefix("team-b"))-len(long))
	rows := []struct {
		name     string
		resource string // of the Deny, under the bucket
		key      string // under the tenant's folder; ManifestKey("j1") unless given
		probe    string // the key's probe, under the bucket
		own      bool   // the tenant's own bucket
		worker   bool   // the worker's refusal, else the tenant's
	}{
		{name: "every tenant's manifest", resource: "tenants/*/runs/*/manifest.json", worker: true},
		{name: "every tenant's manifest, own bucket", resource: "tenants/*/runs/*/manifest.json", own: true},
		{name: "this tenant's manifest", resource: store.TenantPrefix("team-b") + store.ManifestKey("j1")},
		{name: "every tenant's longest key", resource: "tenants/*/runs/*/" + strings.TrimPrefix(long, store.RunPrefix(id)), key: long,
			probe: "tenants/.boxcar-probe/runs/20261207t230000-abcde/" + strings.TrimPrefix(long, store.RunPrefix(id)), worker: true},
		{name: "this tenant's longest key", resource: store.TenantPrefix("team-b") + long, key: long,
			probe: "tenants/.boxcar-probe/runs/20261207t230000-abcde/" + strings.TrimPrefix(long, store.RunPrefix(id))},
	}
	for i, tt := range rows {
		if tt.key == "" {
			tt.key, tt.probe = store.ManifestKey("j1"), "tenants/.boxcar-probe/runs/j1/manifest.json"
		}
		access, bucket := "key"+string(rune('a'+i)), "boxcar-key-"+string(rune('a'+i))
		st := ownedStore(t, srv, access, bucket)
		tenant := store.ForTenant(st, "team-b")
		if tt.own {
			tenant = store.ForTenantBucket(st, "team-b")
		}
		if err := store.Probe(t.Context(), tenant); err != nil {
			t.Fatal(err)
		}
		srv.Deny(t, bucket, access, "s3:PutObject", tt.resource)
		_, err := store.PutOnce(t.Context(), tenant, tt.key, bytes.NewReader([]byte("{}")), 2)
		t.Logf("%s: %v", tt.name, err)
		if tt.worker == errors.Is(err, store.ErrWriteRefused) || tt.worker != errors.Is(err, store.ErrWorkerRefused) || errors.Is(err, store.ErrMaybeStored) {
			t.Errorf("%s: ErrWriteRefused %v, ErrWorkerRefused %v; want the worker's refusal %v, else the tenant's", tt.name,
				errors.Is(err, store.ErrWriteRefused), errors.Is(err, store.ErrWorkerRefused), tt.worker)
		}
		key := store.TenantPrefix("team-b") + tt.key
		for _, want := range []string{"arn:aws:s3:::" + bucket + "/" + key, store.WriteProbeKey, tt.probe} {
			if err == nil || !strings.Contains(err.Error(), want) {
				t.Errorf("%s: the error does not say %q", tt.name, want)
			}
		}
		// The folder's other keys still take writes, and the probe left nothing behind.
		if _, err := store.PutOnce(t.Context(), tenant, "runs/j2/report.md", bytes.NewReader([]byte("{}")), 2); err != nil {
			t.Errorf("%s: a put beside the refused key: %v", tt.name, err)
		}
		if objs, err := st.List(t.Context(), "tenants/.boxcar-probe/"); err != nil || len(objs) != 0 {
			t.Errorf("%s: the key's probe left %v, %v", tt.name, objs, err)
		}
	}
}

// TestBucketGoneIsWhoseInEveryCall: a bucket that is gone answers every call of a tenant's
// store alike: the worker's refusal on the shared store (ErrWorkerRefused), the tenant's on a
// bucket of its own (ErrWriteRefused, not the worker's, which holds every tenant's jobs back).
// Before, a tenant's own bucket's Delete, List, ListAtMost and Partials said the worker's.
func TestBucketGoneIsWhoseInEveryCall(t *testing.T) {
	t.Parallel()
	srv := s3test.StartIAM(t)
	for i, own := range []bool{false, true} {
		access, bucket := "gone"+string(rune('a'+i)), "boxcar-gone-"+string(rune('a'+i))
		st := ownedStore(t, srv, access, bucket)
		tenant := store.ForTenant(st, "team-b")
		if own {
			tenant = store.ForTenantBucket(st, "team-b")
		}
		if err := os.RemoveAll(filepath.Join(srv.Dir, bucket)); err != nil {
			t.Fatal(err)
		}
		ctx := t.Context()
		calls := map[string]func() error{
			"put":  func() error { return tenant.Put(ctx, "runs/j/x", bytes.NewReader(nil), 0) },
			"get":  func() error { _, err := tenant.Get(ctx, "runs/j/x"); return err },
			"stat": func() error { _, err := tenant.Stat(ctx, "runs/j/x"); return err },
			"delete": func() error {
				return tenant.Delete(ctx, "runs/j/x")
			},
			"list":         func() error { _, err := tenant.List(ctx, "runs/"); return err },
			"list at most": func() error { _, _, err := tenant.ListAtMost(ctx, "runs/", 10); return err },
			"partials":     func() error { _, err := store.Partials(ctx, tenant, "runs/"); return err },
		}
		for name, call := range calls {
			err := call()
			if own != errors.Is(err, store.ErrWriteRefused) || own == errors.Is(err, store.ErrWorkerRefused) {
				t.Errorf("own bucket %v: %s = %v; want the worker's refusal, the tenant's for its own bucket", own, name, err)
			}
		}
	}
}

// probeCounter counts the requests to the store's own object (ProbeKey), by method, and
// those to no tenant's folder (tenants/.boxcar-probe/).
type probeCounter struct {
	base    *http.Transport
	mu      sync.Mutex
	by      map[string]int
	inProbe int
}

func (c *probeCounter) RoundTrip(r *http.Request) (*http.Response, error) {
	c.mu.Lock()
	if strings.HasSuffix(r.URL.Path, "/"+store.ProbeKey) {
		c.by[r.Method]++
	}
	if strings.Contains(r.URL.Path, "/tenants/.boxcar-probe/") {
		c.inProbe++
	}
	c.mu.Unlock()
	return c.base.RoundTrip(r)
}

func (c *probeCounter) keyProbes() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.inProbe
}

func (c *probeCounter) reset() {
	c.mu.Lock()
	defer c.mu.Unlock()
	clear(c.by)
}

func (c *probeCounter) counts() map[string]int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return maps.Clone(c.by)
}

// TestSubmitterRefusedSaysItsOwn: a store opened for submit (Options.Submitter), with a
// tenant's credentials that a policy refuses under the tenant's folder, says the refusal is
// the credentials submit uses, and what to change, not a worker's; and it tells it without
// the worker's proofs, which those credentials may not make: no request to the store's own
// object nor to tenants/.boxcar-probe/. Before, a refused put proved the store's own object,
// was refused there too, and said "the store refuses the worker", a read asked to grant the
// worker's credentials s3:GetObject.
func TestSubmitterRefusedSaysItsOwn(t *testing.T) {
	t.Parallel()
	srv := s3test.StartIAM(t)
	counted := &probeCounter{base: http.DefaultTransport.(*http.Transport).Clone(), by: map[string]int{}}
	t.Cleanup(counted.base.CloseIdleConnections)
	st := ownedStoreWith(t, srv, "submitter", "boxcar-submitter", store.Options{Submitter: true, HTTPClient: &http.Client{Transport: counted}})
	tenant := store.ForTenant(st, "team-b")
	input := store.InputKey(strings.Repeat("d", 64))
	if err := tenant.Put(t.Context(), input, bytes.NewReader([]byte("x")), 1); err != nil {
		t.Fatal(err)
	}
	srv.Deny(t, "boxcar-submitter", "submitter", "s3:*", "tenants/*")
	reads := map[string]func() error{
		"put": func() error {
			return tenant.Put(t.Context(), store.InputKey(strings.Repeat("e", 64)), bytes.NewReader([]byte("x")), 1)
		},
		"get":  func() error { _, err := tenant.Get(t.Context(), input); return err },
		"stat": func() error { _, err := tenant.Stat(t.Context(), input); return err },
	}
	for op, call := range reads {
		err := call()
		t.Logf("%s: %v", op, err)
		if err == nil || !strings.Contains(err.Error(), "the credentials submit uses") || strings.Contains(err.Error(), "worker") {
			t.Errorf("%s = %v; want the submitter's credentials refused, no worker named", op, err)
		}
	}
	if got := counted.counts(); len(got) != 0 {
		t.Errorf("the submitter's store sent %v to the store's own object %s", got, store.ProbeKey)
	}
	if n := counted.keyProbes(); n != 0 {
		t.Errorf("the submitter's store sent %d requests to no tenant's folder (tenants/.boxcar-probe/)", n)
	}
}

// TestSubmitterAnswersSayItsOwn: the answers that refuse a store's credentials or its bucket
// whoever asks (a wrong secret key, an access key the store does not know, the bucket gone),
// met by submit's store (Options.Submitter), say what submit's user changes: submit's
// AWS_SECRET_ACCESS_KEY, its --store. Before, they said to correct the worker's
// AWS_SECRET_ACCESS_KEY, or store.url, a worker's setting.
func TestSubmitterAnswersSayItsOwn(t *testing.T) {
	t.Parallel()
	srv := s3test.StartIAM(t)
	rows := []struct {
		name   string
		break_ func(t *testing.T, access, bucket string)
		says   string
	}{
		{"secret key changed", func(t *testing.T, access, _ string) { srv.ChangeSecret(t, access) }, "AWS_SECRET_ACCESS_KEY"},
		{"account removed", func(t *testing.T, access, _ string) { srv.DeleteUser(t, access) }, "AWS_ACCESS_KEY_ID"},
		{"bucket removed", func(t *testing.T, _, bucket string) {
			if err := os.RemoveAll(filepath.Join(srv.Dir, bucket)); err != nil {
				t.Fatal(err)
			}
		}, "--store"},
	}
	for i, tt := range rows {
		t.Run(tt.name, func(t *testing.T) {
			access, bucket := "submitter"+string(rune('a'+i)), "boxcar-submitter-"+string(rune('a'+i))
			st := ownedStoreWith(t, srv, access, bucket, store.Options{Submitter: true})
			tenant := store.ForTenant(st, "team-b")
			tt.break_(t, access, bucket)
			err := tenant.Put(t.Context(), store.InputKey(strings.Repeat("f", 64)), bytes.NewReader([]byte("x")), 1)
			t.Logf("put: %v", err)
			if err == nil || !strings.Contains(err.Error(), tt.says) || strings.Contains(err.Error(), "worker") || strings.Contains(err.Error(), "store.url") {
				t.Errorf("put = %v; want it to say %s, in submit's words, no worker's", err, tt.says)
			}
		})
	}
}
