package store_test

import (
	"context"
	"errors"
	"io"
	"strings"
	"testing"

	"github.com/boxcar-run/boxcar/internal/store"
)

// TestAdoptRootLayout: the inputs and runs a worker before tenants left at the store's root are
// moved into tenant default's folder under the same keys, once: a second pass (another worker's
// start) finds nothing. A run the tenant's folder already holds otherwise (the job committed on
// both sides of the upgrade) stays at the root whole, and the tenant's run is not touched.
func TestAdoptRootLayout(t *testing.T) {
	ctx := t.Context()
	shared := newFile(t)
	tenant := store.ForTenant(shared, "default")
	put := func(st store.Store, key, data string) {
		t.Helper()
		if err := st.PutIfAbsent(ctx, key, strings.NewReader(data), int64(len(data))); err != nil {
			t.Fatal(err)
		}
	}
	older := map[string]string{
		store.InputKey("00ff"):                  "input",
		store.RunPrefix("one") + "report.md":    "report",
		store.SignatureKey("one"):               "envelope",
		store.ManifestKey("one"):                "manifest",
		store.RunPrefix("twice") + "report.md":  "report of the older run",
		store.ManifestKey("twice"):              "the older manifest",
		store.RunPrefix("copied") + "report.md": "copied before",
		store.ManifestKey("copied"):             "copied manifest",
	}
	for k, v := range older {
		put(shared, k, v)
	}
	put(tenant, store.ManifestKey("twice"), "today's manifest")
	put(tenant, store.ManifestKey("copied"), "copied manifest") // a pass cut short after its copy

	done, err := store.AdoptRootLayout(ctx, shared, tenant)
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range older {
		twice := strings.HasPrefix(k, store.RunPrefix("twice"))
		if got := read(ctx, t, tenant, k); !twice && got != v {
			t.Errorf("tenant default's %s = %q, want %q", k, got, v)
		}
		_, err := shared.Stat(ctx, k)
		if moved := errors.Is(err, store.ErrNotFound); moved == twice {
			t.Errorf("%s at the store's root: moved %v, want %v (%v)", k, moved, !twice, err)
		}
		if _, kept := done.Kept[k]; kept != twice {
			t.Errorf("%s in Kept: %v, want %v", k, kept, twice)
		}
	}
	if got := read(ctx, t, tenant, store.ManifestKey("twice")); got != "today's manifest" {
		t.Errorf("tenant default's manifest of the run committed twice = %q, want today's, untouched", got)
	}
	if !errors.Is(done.Kept[store.ManifestKey("twice")], store.ErrOtherObject) {
		t.Errorf("the reason it was kept: %v, want ErrOtherObject", done.Kept[store.ManifestKey("twice")])
	}
	if done.Moved != len(older)-2 {
		t.Errorf("Moved = %d, want %d", done.Moved, len(older)-2)
	}

	again, err := store.AdoptRootLayout(ctx, shared, tenant)
	if err != nil || again.Moved != 0 || len(again.Kept) != 2 {
		t.Errorf("a second pass: %+v, %v; want nothing moved and the run committed twice kept again", again, err)
	}
}

func read(ctx context.Context, t *testing.T, st store.Store, key string) string {
	t.Helper()
	rc, err := st.Get(ctx, key)
	if err != nil {
		t.Errorf("%s: %v", st.URL(key), err)
		return ""
	}
	defer rc.Close()
	data, err := io.ReadAll(rc)
	if err != nil {
		t.Fatal(err)
	}
	return string(data)
}
