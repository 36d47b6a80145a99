package store_test

import (
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/boxcar-run/boxcar/internal/store"
	"github.com/boxcar-run/boxcar/internal/store/storetest"
)

func newFile(t *testing.T) *store.File {
	t.Helper()
	f, err := store.NewFile(filepath.Join(t.TempDir(), "store"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	return f
}

func TestFile(t *testing.T) {
	storetest.Run(t, func(t *testing.T) store.Store { return newFile(t) })
}

func TestFileLayoutAndURL(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "store")
	f, err := store.NewFile(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	key := store.AttemptPrefix("20261202t101500-abcdef012345", "1-0a1b2c3d") + "report.md"
	if err := f.Put(t.Context(), key, strings.NewReader("# report"), -1); err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(filepath.Join(dir, filepath.FromSlash(key)))
	if err != nil || string(data) != "# report" {
		t.Errorf("the object is not the plain file %s: %q, %v", key, data, err)
	}
	if got, want := f.URL(key), "file://"+dir+"/"+key; got != want {
		t.Errorf("URL(%s) = %q, want %q", key, got, want)
	}
}

func TestFileSymlinkEscape(t *testing.T) {
	outside := t.TempDir()
	if err := os.WriteFile(filepath.Join(outside, "secret"), []byte("outside"), 0o600); err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(t.TempDir(), "store")
	f, err := store.NewFile(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	// Links someone else planted in the store: absolute and relative, to a folder and a file.
	for name, target := range map[string]string{
		"abs-dir":  outside,
		"rel-dir":  "../../" + filepath.Base(filepath.Dir(outside)) + "/" + filepath.Base(outside),
		"abs-file": filepath.Join(outside, "secret"),
	} {
		if err := os.Symlink(target, filepath.Join(dir, name)); err != nil {
			t.Fatal(err)
		}
	}
	ctx := t.Context()
	for _, key := range []string{"abs-dir/secret", "rel-dir/secret", "abs-file"} {
		if r, err := f.Get(ctx, key); err == nil {
			data, _ := io.ReadAll(r)
			r.Close()
			t.Errorf("Get(%s) read %q from outside the store", key, data)
		}
		if _, err := f.Stat(ctx, key); err == nil {
			t.Errorf("Stat(%s) reached outside the store", key)
		}
	}
	for _, key := range []string{"abs-dir/new", "rel-dir/new"} {
		if err := f.Put(ctx, key, strings.NewReader("x"), 1); err == nil {
			t.Errorf("Put(%s) wrote through a link out of the store", key)
		}
	}
	// Replacing a planted link replaces the link, never the file it points to.
	if err := f.Put(ctx, "abs-file", strings.NewReader("x"), 1); err != nil {
		t.Errorf("Put over a planted link: %v", err)
	}
	if _, err := os.Stat(filepath.Join(outside, "new")); err == nil {
		t.Errorf("a file appeared outside the store")
	}
	if data, _ := os.ReadFile(filepath.Join(outside, "secret")); string(data) != "outside" {
		t.Errorf("the file outside the store changed to %q", data)
	}
	keys, err := f.List(ctx, "")
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range keys {
		if strings.Contains(k.Key, "secret") {
			t.Errorf("List shows %s from outside the store", k.Key)
		}
	}
}

// TestFileReadersNeverSeePartialObjects holds a put halfway and looks at the store.
func TestFileReadersNeverSeePartialObjects(t *testing.T) {
	const old, half, rest = `{"old":1}`, `{"new":`, `2}`
	tests := []struct {
		name     string
		ifAbsent bool
		existing bool
		wantErr  error
	}{
		{"put", false, false, nil},
		{"put over an object", false, true, nil},
		{"put-if-absent", true, false, nil},
		{"put-if-absent over an object", true, true, store.ErrExists},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := newFile(t)
			ctx := t.Context()
			key := "runs/partial/manifest.json"
			if tt.existing {
				if err := f.Put(ctx, key, strings.NewReader(old), -1); err != nil {
					t.Fatal(err)
				}
			}
			pr, pw := io.Pipe()
			done := make(chan error, 1)
			go func() {
				put := f.Put
				if tt.ifAbsent {
					put = f.PutIfAbsent
				}
				done <- put(ctx, key, pr, -1)
			}()
			// Write returns once the put has taken the bytes; it then waits for the rest.
			if _, err := pw.Write([]byte(half)); err != nil {
				t.Fatal(err)
			}
			if tt.existing {
				if got := string(readAll(t, f, key)); got != old {
					t.Errorf("during the put Get = %q, want the whole old object", got)
				}
			} else if _, err := f.Stat(ctx, key); !errors.Is(err, store.ErrNotFound) {
				t.Errorf("during the put Stat error = %v, want ErrNotFound", err)
			}
			if keys, err := f.List(ctx, ""); err != nil || len(keys) > 1 {
				t.Errorf("during the put List = %+v, %v; want no temporary objects", keys, err)
			}
			if _, err := pw.Write([]byte(rest)); err != nil {
				t.Fatal(err)
			}
			pw.Close()
			if err := <-done; !errors.Is(err, tt.wantErr) {
				t.Fatalf("put error = %v, want %v", err, tt.wantErr)
			}
			want := half + rest
			if tt.wantErr != nil {
				want = old
			}
			if got := string(readAll(t, f, key)); got != want {
				t.Errorf("after the put Get = %q, want %q", got, want)
			}
		})
	}
}

func TestFileFailedPutLeavesNothing(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "store")
	f, err := store.NewFile(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	boom := errors.New("reader broke")
	body := io.MultiReader(strings.NewReader("some bytes"), errReader{boom})
	if err := f.PutIfAbsent(t.Context(), "runs/x/report.md", body, -1); !errors.Is(err, boom) {
		t.Fatalf("PutIfAbsent error = %v, want the reader's error", err)
	}
	entries, err := os.ReadDir(filepath.Join(dir, "runs", "x"))
	if err != nil {
		t.Fatal(err)
	}
	if len(entries) != 0 {
		t.Errorf("a failed put left %d files behind, the first %s", len(entries), entries[0].Name())
	}
}

func TestFileKeyConflicts(t *testing.T) {
	f := newFile(t)
	ctx := t.Context()
	if err := f.Put(ctx, "a/b", strings.NewReader("x"), 1); err != nil {
		t.Fatal(err)
	}
	// "a" is a folder, "a/b" an object: neither can become the other on a file system.
	for _, key := range []string{"a", "a/b/c"} {
		if err := f.Put(ctx, key, strings.NewReader("y"), 1); err == nil {
			t.Errorf("Put(%s) succeeded over a conflicting object or folder", key)
		}
		if err := f.PutIfAbsent(ctx, key, strings.NewReader("y"), 1); err == nil || errors.Is(err, store.ErrExists) {
			t.Errorf("PutIfAbsent(%s) error = %v, want an error other than ErrExists", key, err)
		}
	}
	if err := f.Put(ctx, ".boxcar-tmp-x", strings.NewReader("y"), 1); !errors.Is(err, store.ErrInvalidKey) {
		t.Errorf("Put of a reserved temporary name: error = %v, want ErrInvalidKey", err)
	}
}

func readAll(t *testing.T, s store.Store, key string) []byte {
	t.Helper()
	r, err := s.Get(t.Context(), key)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	data, err := io.ReadAll(r)
	if err != nil {
		t.Fatal(err)
	}
	return data
}

type errReader struct{ err error }

func (e errReader) Read([]byte) (int, error) { return 0, e.err }

// TestFileSharedFolderStaysGroupWritable: in a setgid store folder (shared by a worker and its
// submitters running as different users), the folders one user makes must take the other's
// objects, whatever the umask; in a private one they stay closed to others.
//
//nolint:paralleltest // sets the process's umask, which no parallel test may see
func TestFileSharedFolderStaysGroupWritable(t *testing.T) {
	old := syscall.Umask(0o022)
	defer syscall.Umask(old)
	for _, tc := range []struct {
		name     string
		rootMode os.FileMode
		want     os.FileMode
	}{
		{"private", 0o750, 0o750},
		{"shared", 0o770 | os.ModeSetgid, 0o770 | os.ModeSetgid},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := filepath.Join(t.TempDir(), "store")
			if err := os.Mkdir(dir, 0o700); err != nil {
				t.Fatal(err)
			}
			if err := os.Chmod(dir, tc.rootMode); err != nil {
				t.Fatal(err)
			}
			f, err := store.NewFile(dir)
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			if err := f.Put(t.Context(), "tenants/team-a/inputs/x.csv", strings.NewReader("a,b"), -1); err != nil {
				t.Fatal(err)
			}
			for _, folder := range []string{"tenants", "tenants/team-a", "tenants/team-a/inputs"} {
				info, err := os.Stat(filepath.Join(dir, folder))
				if err != nil {
					t.Fatal(err)
				}
				if got := info.Mode() & (os.ModePerm | os.ModeSetgid); got != tc.want {
					t.Errorf("%s: mode %v, want %v", folder, got, tc.want)
				}
			}
		})
	}
}
