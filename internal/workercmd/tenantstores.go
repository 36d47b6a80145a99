package workercmd

import (
	"context"
	"fmt"
	"net/url"

	"github.com/boxcar-run/boxcar/internal/config"
	"github.com/boxcar-run/boxcar/internal/store"
)

// openTenantStores opens the bucket of each tenant that has one (tenants.T.bucket), at the
// same prefix as store.url's and with the worker's own store credentials; the runner keeps the
// tenant's objects under store.TenantPrefix there too, so a submitter's keys do not depend on
// where its tenant's objects are.
func openTenantStores(ctx context.Context, cfg config.Config, opts store.Options) (map[string]store.Store, error) {
	out := map[string]store.Store{}
	for name, t := range cfg.Tenants {
		if t.Bucket == "" {
			continue
		}
		u, err := url.Parse(cfg.Store.URL)
		if err != nil || u.Scheme != "s3" {
			return nil, fmt.Errorf("tenants.%s.bucket needs an s3:// store.url", name)
		}
		u.Host = t.Bucket
		st, err := store.Open(ctx, u.String(), opts)
		if err != nil {
			for _, o := range out {
				_ = o.Close()
			}
			return nil, fmt.Errorf("tenants.%s.bucket: %w", name, err)
		}
		out[name] = st
	}
	return out, nil
}
