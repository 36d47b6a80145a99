package runner

import (
	"cmp"
	"errors"
	"fmt"
	"strings"

	"github.com/boxcar-run/boxcar/internal/job"
	"github.com/boxcar-run/boxcar/internal/store"
)

// errInputOutsideTenant: an input's URI names an object outside the job's tenant's store.
var errInputOutsideTenant = errors.New("input outside the job's tenant")

// bindTenant gives the attempt its tenant, from the subject the job came on (a delivery
// without one, from a queue before tenants, is the default tenant's), and that tenant's store.
// Whether the worker serves the tenant is admit's to say; a name that cannot be a folder gets
// no store, and its job ends without a manifest.
func (r *Runner) bindTenant(a *attempt) {
	a.tenant = cmp.Or(a.d.Tenant, job.DefaultTenant)
	if !job.ValidTenant(a.tenant) {
		return
	}
	if own, ok := r.cfg.TenantStores[a.tenant]; ok {
		// A bucket that serves the tenant alone: its refusals are the tenant's.
		a.store, a.ownBucket = store.ForTenantBucket(own, a.tenant), true
		return
	}
	a.store = store.ForTenant(r.cfg.Store, a.tenant)
}

// checkInputTenant refuses inputs whose URI is not the object the worker reads for them in
// the tenant's store: a job of one tenant naming another's input (or any object elsewhere)
// would otherwise read as a job that lost its input, and a URI that lies about where the file
// came from would be recorded in the manifest.
func (r *Runner) checkInputTenant(a *attempt) error {
	for _, in := range a.job.Inputs {
		key := store.InputKey(in.SHA256)
		if want := a.store.URL(key); !sameInput(in.URI, want, store.TenantPrefix(a.tenant)+key) && !r.rootInput(in.URI, a.tenant, key) {
			return fmt.Errorf("input %s: its uri %s is outside the store of tenant %s, where the worker reads it from %s; upload it as tenant %s (submit --tenant %s does): %w",
				in.Name, in.URI, a.tenant, want, a.tenant, a.tenant, errInputOutsideTenant)
		}
	}
	return nil
}

// sameInput says whether uri names the object the worker reads at want. A file store is one
// folder that submit and the worker may mount at different paths (a container's volume), so a
// file URI names it by its key under the tenant's folder, whatever the path before it.
func sameInput(uri, want, tenantKey string) bool {
	if uri == want {
		return true
	}
	const file = "file://"
	return strings.HasPrefix(uri, file) && strings.HasPrefix(want, file) && strings.HasSuffix(uri, "/"+tenantKey)
}
