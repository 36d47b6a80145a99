package runner

import (
	"context"
	"fmt"
	"maps"
	"path"
	"slices"
	"strings"

	"github.com/boxcar-run/boxcar/internal/job"
	"github.com/boxcar-run/boxcar/internal/store"
)

// AdoptRootLayout moves the inputs and runs that workers and `submit` before tenants kept at
// the shared store's root into tenant default's folder (store.AdoptRootLayout), before this
// worker fetches a job: a job they queued, moved to tenant default's subject by the queue's
// setup, then finds its input, and one they committed but did not acknowledge is found
// committed, not run again. A worker that does not serve tenant default leaves them to one
// that does. A run left at the root, committed on both sides of the upgrade, is logged for a
// person to settle. Run calls it unless it succeeded before: a worker calls it before it says
// it is ready, waiting out a store that does not answer, so Run's first fetch does not wait.
func (r *Runner) AdoptRootLayout(ctx context.Context) error {
	if _, ok := r.cfg.Worker.TenantsOrDefault()[job.DefaultTenant]; !ok || r.rootAdopted.Load() {
		return nil
	}
	base := r.cfg.Store
	if own, ok := r.cfg.TenantStores[job.DefaultTenant]; ok {
		base = own
	}
	done, err := store.AdoptRootLayout(ctx, r.cfg.Store, store.ForTenant(base, job.DefaultTenant))
	if done.Moved > 0 {
		r.log.WarnContext(ctx, "moved the inputs and runs of workers before tenants from the store's root into tenant default's folder",
			"tenant", job.DefaultTenant, "objects", done.Moved, "to", base.URL(store.TenantPrefix(job.DefaultTenant)))
	}
	for _, key := range slices.Sorted(maps.Keys(done.Kept)) {
		r.log.ErrorContext(ctx, "left an object of a worker before tenants at the store's root: tenant default's folder holds another under its key (the job ran and committed on both sides of the upgrade); compare the two runs and remove the one not to keep",
			"tenant", job.DefaultTenant, "key", key, "error", done.Kept[key])
	}
	if err != nil {
		return fmt.Errorf("runner: move the inputs and runs of workers before tenants into tenant default's folder, which this worker does before it runs any job; check the store and start the worker again: %w", err)
	}
	r.rootAdopted.Store(true)
	return nil
}

// rootInput says whether uri names, in the layout before tenants, the input the worker reads
// for a job of tenant default: key (InputKey) at the shared store's root, which
// AdoptRootLayout moved into the tenant's folder. As sameInput, a file URI names it by its key
// whatever the path before it, but not another tenant's object under that key.
func (r *Runner) rootInput(uri, tenant, key string) bool {
	if tenant != job.DefaultTenant {
		return false
	}
	if uri == r.cfg.Store.URL(key) {
		return true
	}
	const file = "file://"
	dir, found := strings.CutSuffix(uri, "/"+key)
	return found && strings.HasPrefix(uri, file) && strings.HasPrefix(r.cfg.Store.URL(key), file) &&
		!strings.HasSuffix(dir+"/", "/"+store.TenantPrefix(path.Base(dir)))
}
