package submitcmd

import (
	"context"
	"errors"
	"fmt"

	"github.com/boxcar-run/boxcar/internal/job"
	"github.com/boxcar-run/boxcar/internal/provenance"
	"github.com/boxcar-run/boxcar/internal/store"
)

// errRunBeforeTenants marks a run of tenant default still where a worker before tenants
// committed it, at the store's root: no worker of this version that serves tenant default has
// started since, which moves it into the tenant's folder before it runs any job.
var errRunBeforeTenants = errors.New("the run is at the store's root, where workers before tenants committed runs")

// runBeforeTenants returns errRunBeforeTenants, saying where the run is and what to do, when
// job id has no committed run in the tenant's folder and the tenant is default and the store's
// root holds one; nil otherwise. Nothing reads the root's run: it is read once moved, from the
// one place every run is, and an honest run waiting to be moved is not failed as a tampered
// one.
func (e *env) runBeforeTenants(ctx context.Context, st store.Store, id string) error {
	ts, ok := st.(tenantStore)
	if !ok || e.tenant() != job.DefaultTenant {
		return nil
	}
	if _, err := st.Stat(ctx, provenance.ManifestKey(id)); !errors.Is(err, store.ErrNotFound) {
		return nil
	}
	if _, err := ts.shared.Stat(ctx, provenance.ManifestKey(id)); err != nil {
		return nil
	}
	return fmt.Errorf("job %s: %w (%s): start a worker of this version that serves tenant default, which moves it to %s before it runs any job, then try again",
		id, errRunBeforeTenants, ts.shared.URL(store.RunPrefix(id)), st.URL(store.RunPrefix(id)))
}
