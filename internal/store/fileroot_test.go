package store_test

import (
	"bytes"
	"errors"
	"io/fs"
	"os"
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
		dir, tenant := tenantFile(t)
		if proven {
			if err := store.Probe(t.Context(), tenant); err != nil {
				t.Fatalf("the proof before the directory refused: %v", err)
			}
		}
		storetest.ReadOnly(t, dir)
		err := store.Probe(t.Context(), tenant)
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

// TestFileKeyRefusedLeavesNoProbeFolder: a run's folder of a file store that refuses the
// worker's writes, while the tenant's folder takes its proof, is the tenant's refusal
// (ErrWriteRefused), told by the same key written in no tenant's folder
// (tenants/.boxcar-probe/); that write leaves no folder behind, and the error says a mode or
// an owner refuses the key, where it said a policy. Before, each refused key left
// its folders there, empty, which no `submit gc` of a tenant's folders prunes.
func TestFileKeyRefusedLeavesNoProbeFolder(t *testing.T) {
	t.Parallel()
	dir, tenant := tenantFile(t)
	if err := tenant.Put(t.Context(), "runs/j1/status.json", bytes.NewReader([]byte("{}")), 2); err != nil {
		t.Fatal(err)
	}
	if err := store.Probe(t.Context(), tenant); err != nil {
		t.Fatal(err)
	}
	storetest.ReadOnly(t, filepath.Join(dir, "tenants", "team-b", "runs", "j1"))
	_, err := store.PutOnce(t.Context(), tenant, store.ManifestKey("j1"), bytes.NewReader([]byte("{}")), 2)
	t.Logf("%v", err)
	if !errors.Is(err, store.ErrWriteRefused) || errors.Is(err, store.ErrWorkerRefused) {
		t.Errorf("ErrWriteRefused %v, ErrWorkerRefused %v; want the tenant's refusal alone",
			errors.Is(err, store.ErrWriteRefused), errors.Is(err, store.ErrWorkerRefused))
	}
	if err == nil || !strings.Contains(err.Error(), "tenants/.boxcar-probe/runs/j1/manifest.json") {
		t.Errorf("the error does not name the key's probe")
	}
	// A file store has modes and owners, no policies.
	if err == nil || strings.Contains(err.Error(), "policy") {
		t.Errorf("the error names a policy where a file's folder refuses the key")
	}
	if _, err := os.Lstat(filepath.Join(dir, "tenants", ".boxcar-probe")); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("the key's probe left its folder: %v", err)
	}
}

// TestFileReadRefusedSaysWhose: a file store that refuses the worker reading one tenant's
// input (its folder's mode), while the worker reads the store's own object, refuses that input
// alone (ErrReadRefused, which fails the job input_refused), naming the file; one that refuses
// the store's own object too refuses every tenant's reads, the worker's (ErrWorkerRefused,
// waited for not ready), as the S3 store's policies are told. Before, both were a bare EACCES,
// waited out as an outage until the job's attempts ran out. Root reads whatever the modes: the
// test runs as another user.
func TestFileReadRefusedSaysWhose(t *testing.T) {
	t.Parallel()
	input := store.InputKey(strings.Repeat("c", 64))
	for _, every := range []bool{false, true} {
		dir, tenant := tenantFile(t)
		if err := tenant.Put(t.Context(), input, bytes.NewReader([]byte("x")), 1); err != nil {
			t.Fatal(err)
		}
		if err := store.Probe(t.Context(), tenant); err != nil {
			t.Fatal(err)
		}
		refused := []string{filepath.Join(dir, "tenants", "team-b", "inputs")}
		if every {
			refused = append(refused, filepath.Join(dir, filepath.FromSlash(store.ProbeKey)))
		}
		for _, p := range refused {
			unreadable(t, p)
		}
		for op, read := range map[string]func() error{
			"get":  func() error { _, err := tenant.Get(t.Context(), input); return err },
			"stat": func() error { _, err := tenant.Stat(t.Context(), input); return err },
		} {
			err := read()
			t.Logf("every %v: %s: %v", every, op, err)
			if every != errors.Is(err, store.ErrWorkerRefused) || every == errors.Is(err, store.ErrReadRefused) {
				t.Errorf("every %v: %s = %v; want the worker's refusal %v, else the input's (ErrReadRefused)", every, op, err, every)
			}
			if err == nil || !strings.Contains(err.Error(), refused[len(refused)-1]) {
				t.Errorf("every %v: %s does not name %s", every, op, refused[len(refused)-1])
			}
		}
		if _, err := os.Lstat(filepath.Join(dir, "tenants", ".boxcar-probe")); !errors.Is(err, fs.ErrNotExist) {
			t.Errorf("every %v: the key's probe left its folder: %v", every, err)
		}
	}
}

// unreadable takes every permission of p away until the test's end; root ignores modes, so
// the test is skipped where p still reads.
func unreadable(t *testing.T, p string) {
	t.Helper()
	info, err := os.Stat(p)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(p, 0); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.Chmod(p, info.Mode().Perm()) })
	if r, err := os.Open(p); err == nil {
		r.Close()
		t.Skipf("%s reads with mode 0: the test's user (root) ignores modes", p)
	}
}

// tenantFile is a new file store's directory and the store of its tenant team-b.
func tenantFile(t *testing.T) (string, store.Store) {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "store")
	f, err := store.NewFile(dir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	return dir, store.ForTenant(f, "team-b")
}
