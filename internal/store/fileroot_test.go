package store_test

import (
	"bytes"
	"errors"
	"path/filepath"
	"strings"
	"testing"

	"github.com/boxcar-run/boxcar/internal/store"
	"github.com/boxcar-run/boxcar/internal/store/storetest"
)

// TestFileRootRefusedIsTheWorkers: a file store whose directory refuses the worker's writes
// (read-only, or not its user's) refuses every tenant: its Probe proves the directory with the
// store's own object, as the S3 store's does, and fails with ErrWorkerRefused, naming the
// directory, before a tenant's proof could take it for that tenant's folder (ErrWriteRefused,
// which fails the tenant's jobs store_write_refused); so does a write under a tenant's folder
// after the directory was proven, while that proof still holds.
func TestFileRootRefusedIsTheWorkers(t *testing.T) {
	t.Parallel()
	for _, proven := range []bool{false, true} {
		dir := filepath.Join(t.TempDir(), "store")
		f, err := store.NewFile(dir)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { f.Close() })
		tenant := store.ForTenant(f, "team-b")
		if proven {
			if err := store.Probe(t.Context(), tenant); err != nil {
				t.Fatalf("the proof before the directory refused: %v", err)
			}
		}
		storetest.ReadOnly(t, dir)
		err = store.Probe(t.Context(), tenant)
		if proven {
			_, err = store.PutOnce(t.Context(), tenant, store.ManifestKey("j1"), bytes.NewReader([]byte("{}")), 2)
		}
		t.Logf("proven %v: %v", proven, err)
		if !errors.Is(err, store.ErrWorkerRefused) || errors.Is(err, store.ErrWriteRefused) || errors.Is(err, store.ErrMaybeStored) {
			t.Errorf("proven %v: ErrWorkerRefused %v, ErrWriteRefused %v; want the worker's refusal alone", proven,
				errors.Is(err, store.ErrWorkerRefused), errors.Is(err, store.ErrWriteRefused))
		}
		if err == nil || !strings.Contains(err.Error(), dir) {
			t.Errorf("proven %v: the error does not name the directory %s", proven, dir)
		}
	}
}
