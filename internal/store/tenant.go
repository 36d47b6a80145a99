package store

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
)

// TenantPrefix is the folder of one tenant's objects: its inputs (InputKey) and runs
// (RunPrefix) are under it, in the shared bucket or in a bucket of the tenant's own.
func TenantPrefix(tenant string) string { return "tenants/" + tenant + "/" }

// ForTenant returns the store of one tenant's objects: st, with every key under
// TenantPrefix(tenant). Keys given to it and listed by it are relative to that folder, so the
// run layout (InputKey, RunPrefix, ManifestKey …) reads the same for every tenant, and no key
// can reach another tenant's folder (a key that climbs with ".." is ErrInvalidKey). Closing it
// leaves st open. tenant must be a valid tenant name (job.ValidTenant).
func ForTenant(st Store, tenant string) Store {
	return &tenantStore{st: st, prefix: TenantPrefix(tenant), submitter: bySubmitter(st)}
}

// ForTenantBucket is ForTenant on a store of the tenant's own (tenants.T.bucket), which serves
// no other tenant: an answer that refuses the store as a whole (its bucket gone or disabled,
// its probe object refused: ErrWorkerRefused on the shared store) refuses this tenant's writes
// alone, and its errors wrap ErrWriteRefused instead.
func ForTenantBucket(st Store, tenant string) Store {
	return &tenantStore{st: st, prefix: TenantPrefix(tenant), ownBucket: true, submitter: bySubmitter(st)}
}

// tenantStore is ForTenant's store.
type tenantStore struct {
	st        Store
	prefix    string
	ownBucket bool // ForTenantBucket's
	submitter bool // on a submitter's store (Options.Submitter)
}

// bySubmitter: st was opened for a submitter (Options.Submitter).
func bySubmitter(st Store) bool {
	switch s := st.(type) {
	case *S3:
		return s.probe.submitter
	case *File:
		return s.probe.submitter
	}
	return false
}

// keyRefused is the package's keyRefused of a write of key, a worker's: a submitter's refusal
// is its own credentials' (submitterRefused).
func (t *tenantStore) keyRefused(ctx context.Context, key string, err error) error {
	if t.submitter {
		return t.submitterRefused(err)
	}
	return t.refused(keyRefused(ctx, t.st, t.prefix, key, err))
}

// readKeyRefused is keyRefused of a read.
func (t *tenantStore) readKeyRefused(ctx context.Context, key string, err error) error {
	if t.submitter {
		return t.submitterRefused(err)
	}
	return t.refused(readKeyRefused(ctx, t.st, t.prefix, key, err))
}

// submitterRefused says what a submitter changes for a refusal of its credentials under the
// tenant's folder (S3's AccessDenied, the file store's EACCES): the words for a worker name a
// worker's credentials and a policy of the operator's. A file store's are the user submit runs
// as, which no AWS setting changes.
func (t *tenantStore) submitterRefused(err error) error {
	if !refusedWrite(err) {
		return err
	}
	if _, ok := t.st.(*File); ok {
		return fmt.Errorf("%w; the store refuses the user submit runs as under the tenant's folder %s: let that user read and write there (the folders' owner, group or mode; a directory mounted read-write), or run submit as a user who may", err, t.URL(""))
	}
	return fmt.Errorf("%w; the store refuses the credentials submit uses under the tenant's folder %s: use the ones issued for this tenant (--tenant, AWS_PROFILE or AWS_ACCESS_KEY_ID), or ask the store's operator to let them read and write there", err, t.URL(""))
}

// refused is err, or for a store of the tenant's own whose whole store refused the worker,
// the tenant's refusal (ErrWriteRefused). Every call's error goes through it: one that said
// the worker's held every tenant's jobs back for one tenant's bucket.
func (t *tenantStore) refused(err error) error {
	var ref *refusal
	if !t.ownBucket || !errors.As(err, &ref) || ref.by != byStore {
		return err
	}
	return fmt.Errorf("store: %w under %s: %v; it is the tenant's own bucket (tenants.<name>.bucket), so no job of the tenant can be committed until it takes the worker's writes", ErrWriteRefused, t.URL(""), err)
}

var _ Store = (*tenantStore)(nil)

func (t *tenantStore) key(key string) (string, error) {
	if !ValidKey(key) {
		return "", fmt.Errorf("%w %q", ErrInvalidKey, key)
	}
	return t.prefix + key, nil
}

func (t *tenantStore) Put(ctx context.Context, key string, r io.Reader, size int64) error {
	k, err := t.key(key)
	if err != nil {
		return err
	}
	return t.keyRefused(ctx, k, t.st.Put(ctx, k, r, size))
}

func (t *tenantStore) PutIfAbsent(ctx context.Context, key string, r io.Reader, size int64) error {
	k, err := t.key(key)
	if err != nil {
		return err
	}
	return t.keyRefused(ctx, k, t.st.PutIfAbsent(ctx, k, r, size))
}

func (t *tenantStore) Get(ctx context.Context, key string) (io.ReadCloser, error) {
	k, err := t.key(key)
	if err != nil {
		return nil, err
	}
	rc, err := t.st.Get(ctx, k)
	return rc, t.readKeyRefused(ctx, k, err)
}

func (t *tenantStore) Stat(ctx context.Context, key string) (ObjectInfo, error) {
	k, err := t.key(key)
	if err != nil {
		return ObjectInfo{}, err
	}
	info, err := t.st.Stat(ctx, k)
	info.Key = strings.TrimPrefix(info.Key, t.prefix)
	return info, t.readKeyRefused(ctx, k, err)
}

func (t *tenantStore) Delete(ctx context.Context, key string) error {
	k, err := t.key(key)
	if err != nil {
		return err
	}
	return t.refused(t.st.Delete(ctx, k))
}

func (t *tenantStore) List(ctx context.Context, prefix string) ([]ObjectInfo, error) {
	if prefix != "" && !ValidKey(strings.TrimSuffix(prefix, "/")) {
		return nil, fmt.Errorf("%w: prefix %q", ErrInvalidKey, prefix)
	}
	objs, err := t.st.List(ctx, t.prefix+prefix)
	return t.own(objs), t.refused(err)
}

// ListAtMost is the shared store's ListAtMost under the tenant's folder, keys relative to it.
func (t *tenantStore) ListAtMost(ctx context.Context, prefix string, n int) ([]ObjectInfo, bool, error) {
	if prefix != "" && !ValidKey(strings.TrimSuffix(prefix, "/")) {
		return nil, false, fmt.Errorf("%w: prefix %q", ErrInvalidKey, prefix)
	}
	objs, more, err := t.st.ListAtMost(ctx, t.prefix+prefix, n)
	return t.own(objs), more, t.refused(err)
}

// own is what the shared store listed, keys relative to the tenant's folder, less the proof of
// writes (WriteProbeKey), which is the store's own, not one of the caller's.
func (t *tenantStore) own(objs []ObjectInfo) []ObjectInfo {
	for i := range objs {
		objs[i].Key = strings.TrimPrefix(objs[i].Key, t.prefix)
	}
	return slices.DeleteFunc(objs, func(o ObjectInfo) bool { return o.Key == WriteProbeKey })
}

// URL names the object with the tenant's folder: the URL a submitter of the tenant writes.
func (t *tenantStore) URL(key string) string { return t.st.URL(t.prefix + key) }

// Close leaves the shared store open: its owner closes it.
func (t *tenantStore) Close() error { return nil }

// Probe proves the shared store, whose server the tenant's objects are on (see Probe), and
// then that the worker may write the tenant's runs: a store that refuses writes under the
// tenant's folder alone (IAM scoped by prefix) fails with ErrWriteRefused, naming the folder
// and what to change, before any job of the tenant runs, where the run's commit found it after
// the model's tokens were spent. Both proofs are held for a while (Options.ProbeInterval).
func (t *tenantStore) Probe(ctx context.Context) error {
	if err := Probe(ctx, t.st); err != nil {
		return t.refused(err)
	}
	return t.refused(proveWrites(ctx, t.st, t.prefix))
}

// Partials lists the unfinished writes under the tenant's prefix, keys relative to it.
func (t *tenantStore) Partials(ctx context.Context, prefix string) ([]Partial, error) {
	if prefix != "" && !ValidKey(strings.TrimSuffix(prefix, "/")) {
		return nil, fmt.Errorf("%w: prefix %q", ErrInvalidKey, prefix)
	}
	partials, err := Partials(ctx, t.st, t.prefix+prefix)
	for i := range partials {
		partials[i].Key = strings.TrimPrefix(partials[i].Key, t.prefix)
	}
	return partials, t.refused(err)
}

// DiscardPartial discards an unfinished write of the tenant's.
func (t *tenantStore) DiscardPartial(ctx context.Context, p Partial) error {
	k, err := t.key(p.Key)
	if err != nil {
		return err
	}
	p.Key = k
	return t.refused(DiscardPartial(ctx, t.st, p))
}

// PruneFolders prunes the empty folders under a folder of the tenant's.
func (t *tenantStore) PruneFolders(ctx context.Context, prefix string) error {
	if _, err := t.key(strings.TrimSuffix(prefix, "/")); err != nil {
		return err
	}
	return t.refused(PruneFolders(ctx, t.st, t.prefix+prefix))
}
