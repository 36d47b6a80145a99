// Package storetest is the conformance suite every store backend passes: round trips,
// overwrites, create-only puts and their races, not-found and invalid keys, sorted listing,
// bodies of unknown size, bodies that fail midway and a 64 MiB object, sizes and modification
// times in listings. It owns no backend.
package storetest

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"testing"
	"testing/iotest"
	"time"

	"github.com/boxcar-run/boxcar/internal/store"
)

// LargeSize is the size of the large-object case: several parts of a multipart upload.
const LargeSize = 64 << 20

// Run runs the suite. newStore returns a fresh, empty store for one subtest; it registers its
// own clean-up with t.Cleanup.
func Run(t *testing.T, newStore func(t *testing.T) store.Store) {
	tests := []struct {
		name string
		run  func(t *testing.T, s store.Store)
	}{
		{"RoundTripBinary", testRoundTripBinary},
		{"EmptyObject", testEmptyObject},
		{"Overwrite", testOverwrite},
		{"PutIfAbsent", testPutIfAbsent},
		{"PutIfAbsentRace", testPutIfAbsentRace},
		{"PutOnce", testPutOnce},
		{"NotFound", testNotFound},
		{"InvalidKeys", testInvalidKeys},
		{"List", testList},
		{"ListAtMost", testListAtMost},
		{"ListKeysAsWritten", testListKeysAsWritten},
		{"ListSizesAndTimes", testListSizesAndTimes},
		{"Delete", testDelete},
		{"UnknownSize", testUnknownSize},
		{"SizeMismatch", testSizeMismatch},
		{"FailingBody", testFailingBody},
		{"CanceledContext", testCanceledContext},
		{"Large", testLarge},
		{"ContentTypes", testContentTypes},
		{"LongArtifactNames", testLongArtifactNames},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) { tt.run(t, newStore(t)) })
	}
}

func testRoundTripBinary(t *testing.T, s store.Store) {
	ctx := t.Context()
	data := make([]byte, 256*3+17)
	for i := range data {
		data[i] = byte(i) // every byte value, NUL and 0xff included
	}
	key := "runs/round-trip/artifacts/data.bin"
	if err := s.Put(ctx, key, bytes.NewReader(data), int64(len(data))); err != nil {
		t.Fatal(err)
	}
	if got := get(t, s, key); !bytes.Equal(got, data) {
		t.Errorf("Get(%s) returned %d bytes that differ from the %d put", key, len(got), len(data))
	}
	info, err := s.Stat(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	if info.Key != key || info.Size != int64(len(data)) {
		t.Errorf("Stat(%s) = %+v, want key %s size %d", key, info, key, len(data))
	}
	if u := s.URL(key); !strings.HasSuffix(u, "/"+key) || !strings.Contains(u, "://") {
		t.Errorf("URL(%s) = %q, want a URL ending in the key", key, u)
	}
}

func testEmptyObject(t *testing.T, s store.Store) {
	key := "empty"
	if err := s.Put(t.Context(), key, strings.NewReader(""), 0); err != nil {
		t.Fatal(err)
	}
	if got := get(t, s, key); len(got) != 0 {
		t.Errorf("Get(%s) = %d bytes, want 0", key, len(got))
	}
	info, err := s.Stat(t.Context(), key)
	if err != nil {
		t.Fatal(err)
	}
	if info.Size != 0 {
		t.Errorf("Stat(%s).Size = %d, want 0", key, info.Size)
	}
}

func testOverwrite(t *testing.T, s store.Store) {
	ctx := t.Context()
	key := "runs/overwrite/report.md"
	first, second := "the first, longer version of the report", "second"
	for _, body := range []string{first, second} {
		if err := s.Put(ctx, key, strings.NewReader(body), int64(len(body))); err != nil {
			t.Fatal(err)
		}
	}
	if got := string(get(t, s, key)); got != second {
		t.Errorf("after overwrite Get(%s) = %q, want %q", key, got, second)
	}
	info, err := s.Stat(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	if info.Size != int64(len(second)) {
		t.Errorf("after overwrite Stat(%s).Size = %d, want %d", key, info.Size, len(second))
	}
}

func testPutIfAbsent(t *testing.T, s store.Store) {
	ctx := t.Context()
	key := "runs/once/manifest.json"
	original := `{"winner":true}`
	if err := s.PutIfAbsent(ctx, key, strings.NewReader(original), int64(len(original))); err != nil {
		t.Fatalf("first PutIfAbsent: %v", err)
	}
	loser := `{"winner":false,"longer":true}`
	err := s.PutIfAbsent(ctx, key, strings.NewReader(loser), int64(len(loser)))
	if !errors.Is(err, store.ErrExists) {
		t.Fatalf("second PutIfAbsent error = %v, want ErrExists", err)
	}
	err = s.PutIfAbsent(ctx, key, strings.NewReader(loser), -1)
	if !errors.Is(err, store.ErrExists) {
		t.Fatalf("second PutIfAbsent of unknown size error = %v, want ErrExists", err)
	}
	if got := string(get(t, s, key)); got != original {
		t.Errorf("after the losing PutIfAbsent Get(%s) = %q, want the original %q", key, got, original)
	}
	if keys := list(t, s, "runs/once/"); !slices.Equal(keys, []string{key}) {
		t.Errorf("List after the losing PutIfAbsent = %q, want only %s (no temporary objects)", keys, key)
	}
}

// testPutOnce: a create-only put of the bytes already stored (its own earlier try, whose
// answer was lost) succeeds; of other bytes it fails with ErrExists and changes nothing.
func testPutOnce(t *testing.T, s store.Store) {
	ctx := t.Context()
	key := "runs/once/manifest.json"
	mine := `{"attempt":1}`
	for try := 1; try <= 2; try++ {
		got, err := store.PutOnce(ctx, s, key, strings.NewReader(mine), int64(len(mine)))
		if err != nil {
			t.Fatalf("PutOnce try %d of the same bytes: %v, want nil: the stored object is this body", try, err)
		}
		if want := fmt.Sprintf("%x", sha256.Sum256([]byte(mine))); got.SHA256 != want || got.Size != int64(len(mine)) {
			t.Errorf("PutOnce try %d digest = %+v, want sha256 %s, %d bytes", try, got, want, len(mine))
		}
	}
	other := `{"attempt":2}`
	if _, err := store.PutOnce(ctx, s, key, strings.NewReader(other), int64(len(other))); !errors.Is(err, store.ErrExists) || errors.Is(err, store.ErrMaybeStored) {
		t.Errorf("PutOnce of other bytes: %v, want ErrExists alone", err)
	}
	if got := string(get(t, s, key)); got != mine {
		t.Errorf("after PutOnce of other bytes Get(%s) = %q, want %q", key, got, mine)
	}
}

func testPutIfAbsentRace(t *testing.T, s store.Store) {
	const writers = 8
	ctx := t.Context()
	key := "runs/race/manifest.json"
	bodies := make([]string, writers)
	errs := make([]error, writers)
	start := make(chan struct{})
	var wg sync.WaitGroup
	for i := range writers {
		bodies[i] = fmt.Sprintf("writer %d %s", i, strings.Repeat("x", 1000*i))
		wg.Go(func() {
			<-start
			errs[i] = s.PutIfAbsent(ctx, key, strings.NewReader(bodies[i]), int64(len(bodies[i])))
		})
	}
	close(start)
	wg.Wait()
	winner := -1
	for i, err := range errs {
		switch {
		case err == nil && winner >= 0:
			t.Errorf("writers %d and %d both won", winner, i)
		case err == nil:
			winner = i
		case !errors.Is(err, store.ErrExists):
			t.Errorf("writer %d: error = %v, want nil or ErrExists", i, err)
		}
	}
	if winner < 0 {
		t.Fatalf("no writer won: %v", errs)
	}
	if got := string(get(t, s, key)); got != bodies[winner] {
		t.Errorf("Get(%s) = %.40q…, want the winner's (writer %d) body", key, got, winner)
	}
}

func testNotFound(t *testing.T, s store.Store) {
	ctx := t.Context()
	if err := s.Put(ctx, "runs/present/report.md", strings.NewReader("x"), 1); err != nil {
		t.Fatal(err)
	}
	for _, key := range []string{
		"runs/absent/report.md",
		"runs/present",             // a folder of objects is not an object
		"runs/present/report.md/x", // under an object
	} {
		if r, err := s.Get(ctx, key); !errors.Is(err, store.ErrNotFound) {
			if err == nil {
				r.Close()
			}
			t.Errorf("Get(%s) error = %v, want ErrNotFound", key, err)
		}
		if _, err := s.Stat(ctx, key); !errors.Is(err, store.ErrNotFound) {
			t.Errorf("Stat(%s) error = %v, want ErrNotFound", key, err)
		}
	}
}

func testInvalidKeys(t *testing.T, s store.Store) {
	ctx := t.Context()
	for _, key := range []string{"", "/etc/passwd", "..", "../escape", "a/../../escape", "a//b", "a/", "./a", "a/./b", "nul\x00byte"} {
		if err := s.Put(ctx, key, strings.NewReader("x"), 1); !errors.Is(err, store.ErrInvalidKey) {
			t.Errorf("Put(%q) error = %v, want ErrInvalidKey", key, err)
		}
		if err := s.PutIfAbsent(ctx, key, strings.NewReader("x"), 1); !errors.Is(err, store.ErrInvalidKey) {
			t.Errorf("PutIfAbsent(%q) error = %v, want ErrInvalidKey", key, err)
		}
		if r, err := s.Get(ctx, key); !errors.Is(err, store.ErrInvalidKey) {
			if err == nil {
				r.Close()
			}
			t.Errorf("Get(%q) error = %v, want ErrInvalidKey", key, err)
		}
		if _, err := s.Stat(ctx, key); !errors.Is(err, store.ErrInvalidKey) {
			t.Errorf("Stat(%q) error = %v, want ErrInvalidKey", key, err)
		}
	}
	for _, prefix := range []string{"/", "../", "a/../", "a//"} {
		if _, err := s.List(ctx, prefix); !errors.Is(err, store.ErrInvalidKey) {
			t.Errorf("List(%q) error = %v, want ErrInvalidKey", prefix, err)
		}
	}
	if keys := list(t, s, ""); len(keys) != 0 {
		t.Errorf("after rejected puts the store holds %q, want nothing", keys)
	}
}

func testList(t *testing.T, s store.Store) {
	ctx := t.Context()
	keys := []string{
		"runs/b/report.md",
		"runs/a/report.md",
		"runs/a/artifacts/z.csv",
		"runs/a/artifacts/a.csv",
		"runs/a-c/report.md", // sorts before "runs/a/" as a string
		"runs/ab",
		"inputs/sha256/00ff",
	}
	for _, k := range keys {
		if err := s.Put(ctx, k, strings.NewReader(k), int64(len(k))); err != nil {
			t.Fatal(err)
		}
	}
	tests := []struct {
		name   string
		prefix string
		want   []string
	}{
		{"everything", "", []string{"inputs/sha256/00ff", "runs/a-c/report.md", "runs/a/artifacts/a.csv", "runs/a/artifacts/z.csv", "runs/a/report.md", "runs/ab", "runs/b/report.md"}},
		{"folder", "runs/a/", []string{"runs/a/artifacts/a.csv", "runs/a/artifacts/z.csv", "runs/a/report.md"}},
		{"partial name", "runs/a", []string{"runs/a-c/report.md", "runs/a/artifacts/a.csv", "runs/a/artifacts/z.csv", "runs/a/report.md", "runs/ab"}},
		{"partial file name", "runs/a/rep", []string{"runs/a/report.md"}},
		{"one object", "runs/ab", []string{"runs/ab"}},
		{"nothing", "runs/zzz/", nil},
		{"under an object", "runs/ab/", nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := list(t, s, tt.prefix)
			if len(got) == 0 && len(tt.want) == 0 {
				return
			}
			if !slices.Equal(got, tt.want) {
				t.Errorf("List(%q) = %q, want %q", tt.prefix, got, tt.want)
			}
		})
	}
}

// testListAtMost: ListAtMost returns no more objects than asked, each one List returns, and
// says whether there are more, itself and through a tenant's folder: a reader of a folder
// others may write stops where it chose, not where they did.
func testListAtMost(t *testing.T, s store.Store) {
	ctx := t.Context()
	var all []string
	for i := range 5 {
		k := fmt.Sprintf("tenants/t/runs/a/attempts/x/artifacts/%d.csv", i)
		if err := s.Put(ctx, k, strings.NewReader(k), int64(len(k))); err != nil {
			t.Fatal(err)
		}
		all = append(all, strings.TrimPrefix(k, "tenants/t/"))
	}
	for st, prefix := range map[store.Store]string{s: "tenants/t/runs/a/", store.ForTenant(s, "t"): "runs/a/"} {
		for _, tt := range []struct {
			n    int
			want int
			more bool
		}{{0, 0, true}, {1, 1, true}, {4, 4, true}, {5, 5, false}, {6, 5, false}} {
			got, more, err := store.ListAtMost(ctx, st, prefix, tt.n)
			if err != nil {
				t.Fatal(err)
			}
			if len(got) != tt.want || more != tt.more {
				t.Errorf("ListAtMost(%s%s, %d) = %d objects, more %v; want %d, more %v", st.URL(""), prefix, tt.n, len(got), more, tt.want, tt.more)
			}
			for _, o := range got {
				if !slices.Contains(all, strings.TrimPrefix(o.Key, "tenants/t/")) {
					t.Errorf("ListAtMost(%s, %d) listed %s, which is not under it", prefix, tt.n, o.Key)
				}
			}
		}
	}
}

// testListKeysAsWritten: List returns every key Put took as itself, those with characters
// that URLs and XML escape among them; keys a listing could not carry are refused by Put.
func testListKeysAsWritten(t *testing.T, s store.Store) {
	ctx := t.Context()
	keys := []string{"runs/k/a b.csv", "runs/k/a+b.csv", "runs/k/100%.csv", "runs/k/%2B.csv", "runs/k/<&>'\".txt", "runs/k/é€😀.md", "runs/k/\uFFFD.txt", "runs/k/a~!$()*,;=@:.txt"}
	for _, k := range keys {
		if err := s.PutIfAbsent(ctx, k, strings.NewReader("x"), 1); err != nil {
			t.Fatalf("PutIfAbsent(%q): %v", k, err)
		}
	}
	slices.Sort(keys)
	if got := list(t, s, "runs/k/"); !slices.Equal(got, keys) {
		t.Errorf("List = %q, want %q", got, keys)
	}
	for _, k := range []string{"runs/k/a\uFFFF", "runs/k/b\uFFFE", "runs/k/tab\tname", "runs/k/line\nbreak", "runs/k/del\x7f", "runs/k/c1\u0085", "runs/k/bad\xffutf8"} {
		if err := s.PutIfAbsent(ctx, k, strings.NewReader("x"), 1); !errors.Is(err, store.ErrInvalidKey) {
			t.Errorf("PutIfAbsent(%q) = %v, want ErrInvalidKey: no listing carries it", k, err)
		}
		if err := s.Put(ctx, k, strings.NewReader("x"), 1); !errors.Is(err, store.ErrInvalidKey) {
			t.Errorf("Put(%q) = %v, want ErrInvalidKey: no listing carries it", k, err)
		}
	}
	if got := list(t, s, "runs/k/"); !slices.Equal(got, keys) {
		t.Errorf("after the refused puts List = %q, want %q", got, keys)
	}
}

// testListSizesAndTimes: List and Stat give each object's size and the time it was written
// (`submit gc` judges an attempt folder's age by it). The window is wide: S3 keeps whole
// seconds, and the server's clock is not the test's.
func testListSizesAndTimes(t *testing.T, s store.Store) {
	ctx := t.Context()
	sizes := map[string]int{"runs/t/attempts/1-a/report.md": 0, "runs/t/attempts/1-a/artifacts/x.csv": 1234, "runs/t/manifest.json": 17}
	start := time.Now()
	for k, n := range sizes {
		if err := s.PutIfAbsent(ctx, k, strings.NewReader(strings.Repeat("x", n)), int64(n)); err != nil {
			t.Fatal(err)
		}
	}
	end := time.Now()
	recent := func(m time.Time) bool { return m.After(start.Add(-time.Minute)) && m.Before(end.Add(time.Minute)) }
	objects, err := s.List(ctx, "runs/t/")
	if err != nil {
		t.Fatal(err)
	}
	if len(objects) != len(sizes) {
		t.Fatalf("List(runs/t/) = %+v, want %d objects", objects, len(sizes))
	}
	for _, o := range objects {
		if want, ok := sizes[o.Key]; !ok || o.Size != int64(want) {
			t.Errorf("List gives %s size %d, want %d", o.Key, o.Size, want)
		}
		if !recent(o.ModTime) {
			t.Errorf("List gives %s modified at %v, want the time of its put (%v)", o.Key, o.ModTime, start)
		}
		info, err := s.Stat(ctx, o.Key)
		if err != nil {
			t.Fatal(err)
		}
		if !recent(info.ModTime) {
			t.Errorf("Stat(%s).ModTime = %v, want the time of its put (%v)", o.Key, info.ModTime, start)
		}
	}
}

func testUnknownSize(t *testing.T, s store.Store) {
	// Sizes around S3's part sizes: nothing, tiny, just over the default 16 MiB part, and
	// exactly two parts of the smallest part size S3 allows (5 MiB).
	for _, size := range []int64{0, 1000, 16<<20 + 1, 10 << 20} {
		t.Run(fmt.Sprint(size), func(t *testing.T) {
			key := fmt.Sprintf("unknown/%d.bin", size)
			want := putRandom(t, s, key, size, -1)
			checkDigest(t, s, key, size, want)
		})
	}
}

func testSizeMismatch(t *testing.T, s store.Store) {
	ctx := t.Context()
	tests := []struct {
		name string
		body string
		size int64
	}{
		{"short body", "12345", 10},
		{"long body", "1234567890", 5},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			key := "mismatch/" + strings.ReplaceAll(tt.name, " ", "-")
			if err := s.Put(ctx, key, strings.NewReader(tt.body), tt.size); err == nil {
				t.Errorf("Put of %d bytes declared as %d succeeded, want an error", len(tt.body), tt.size)
			}
			if err := s.PutIfAbsent(ctx, key, strings.NewReader(tt.body), tt.size); err == nil {
				t.Errorf("PutIfAbsent of %d bytes declared as %d succeeded, want an error", len(tt.body), tt.size)
			}
			if _, err := s.Stat(ctx, key); !errors.Is(err, store.ErrNotFound) {
				t.Errorf("after the failed puts Stat(%s) error = %v, want ErrNotFound", key, err)
			}
		})
	}
}

// testFailingBody: a create-only put whose body fails midway (a stream from a sandbox that
// broke off), within the first part or after it, fails with the body's error and leaves
// nothing under the key, so that the key can still be created whole.
func testFailingBody(t *testing.T, s store.Store) {
	ctx := t.Context()
	broken := errors.New("the stream broke off")
	for _, tt := range []struct {
		name         string
		size, failAt int64
	}{
		{"in the first part", 1000, 400},
		{"after the first part", 20 << 20, 17 << 20},
	} {
		t.Run(tt.name, func(t *testing.T) {
			key := "failing/" + strings.ReplaceAll(tt.name, " ", "-")
			body := io.MultiReader(io.LimitReader(rand.NewChaCha8([32]byte{1}), tt.failAt), iotest.ErrReader(broken))
			if err := s.PutIfAbsent(ctx, key, onlyReader{body}, tt.size); !errors.Is(err, broken) {
				t.Errorf("PutIfAbsent with a body failing after %d of %d bytes: error = %v, want the body's", tt.failAt, tt.size, err)
			}
			if _, err := s.Stat(ctx, key); !errors.Is(err, store.ErrNotFound) {
				t.Errorf("after the failed put Stat(%s) error = %v, want ErrNotFound", key, err)
			}
			if objs, err := s.List(ctx, "failing/"); err != nil || slices.ContainsFunc(objs, func(o store.ObjectInfo) bool { return o.Key == key }) {
				t.Errorf("List after the failed put = %v, %v; want no %s", objs, err, key)
			}
			if err := s.PutIfAbsent(ctx, key, strings.NewReader("whole"), 5); err != nil {
				t.Errorf("PutIfAbsent after the failed one: %v, want the key still free", err)
			}
		})
	}
}

func testCanceledContext(t *testing.T, s store.Store) {
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	key := "canceled"
	if err := s.Put(ctx, key, strings.NewReader("x"), 1); !errors.Is(err, context.Canceled) {
		t.Errorf("Put with a canceled context: error = %v, want context.Canceled", err)
	}
	if _, err := s.Stat(t.Context(), key); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("after a canceled Put Stat(%s) error = %v, want ErrNotFound", key, err)
	}
}

func testLarge(t *testing.T, s store.Store) {
	key := "runs/large/artifacts/large.csv"
	want := putRandom(t, s, key, LargeSize, LargeSize)
	checkDigest(t, s, key, LargeSize, want)
	// A multipart upload carries the content type too.
	checkContentType(t, s, key)
}

// ContentTypeKeys are keys of every kind in the run layout, for content-type checks.
func ContentTypeKeys() []string {
	const id = "20261202t101500-abcdef012345"
	attempt := store.AttemptPrefix(id, "1-0a1b2c3d")
	return []string{
		attempt + "report.md", attempt + "transcript.jsonl", store.ManifestKey(id), store.SignatureKey(id), store.AttemptSignatureKey(id, "1-0a1b2c3d"),
		attempt + "artifacts/table.csv", attempt + "artifacts/page.html", attempt + "artifacts/chart.png",
		attempt + "artifacts/Makefile", store.InputKey(strings.Repeat("0f", 32)),
	}
}

func testContentTypes(t *testing.T, s store.Store) {
	ctx := t.Context()
	for i, key := range ContentTypeKeys() {
		put := s.Put
		if i%2 == 1 {
			put = s.PutIfAbsent
		}
		if err := put(ctx, key, strings.NewReader(key), -1); err != nil {
			t.Fatal(err)
		}
		checkContentType(t, s, key)
	}
}

func checkContentType(t *testing.T, s store.Store, key string) {
	t.Helper()
	info, err := s.Stat(t.Context(), key)
	if err != nil {
		t.Fatal(err)
	}
	if want := store.ContentType(key); info.ContentType != want {
		t.Errorf("Stat(%s).ContentType = %q, want %q", key, info.ContentType, want)
	}
}

// putRandom puts size pseudo-random bytes under key, declaring declared as the size, and
// returns their SHA-256.
func putRandom(t *testing.T, s store.Store, key string, size, declared int64) []byte {
	t.Helper()
	h := sha256.New()
	src := io.TeeReader(io.LimitReader(rand.NewChaCha8([32]byte{byte(size), byte(size >> 8), byte(size >> 16)}), size), h)
	// onlyReader hides any WriterTo or Seeker, so the store sees a plain stream.
	if err := s.Put(t.Context(), key, onlyReader{src}, declared); err != nil {
		t.Fatal(err)
	}
	return h.Sum(nil)
}

// checkDigest reads key back and compares its length and SHA-256.
func checkDigest(t *testing.T, s store.Store, key string, size int64, want []byte) {
	t.Helper()
	r, err := s.Get(t.Context(), key)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	h := sha256.New()
	n, err := io.Copy(h, r)
	if err != nil {
		t.Fatalf("read %s: %v", key, err)
	}
	if n != size {
		t.Errorf("Get(%s) returned %d bytes, want %d", key, n, size)
	}
	if got := h.Sum(nil); !bytes.Equal(got, want) {
		t.Errorf("Get(%s) sha256 = %x, want %x", key, got, want)
	}
	info, err := s.Stat(t.Context(), key)
	if err != nil {
		t.Fatal(err)
	}
	if info.Size != size {
		t.Errorf("Stat(%s).Size = %d, want %d", key, info.Size, size)
	}
}

func get(t *testing.T, s store.Store, key string) []byte {
	t.Helper()
	r, err := s.Get(t.Context(), key)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	data, err := io.ReadAll(r)
	if err != nil {
		t.Fatalf("read %s: %v", key, err)
	}
	return data
}

// list returns the keys List gives for prefix.
func list(t *testing.T, s store.Store, prefix string) []string {
	t.Helper()
	objects, err := s.List(t.Context(), prefix)
	if err != nil {
		t.Fatal(err)
	}
	keys := []string{}
	for _, o := range objects {
		keys = append(keys, o.Key)
	}
	return keys
}

type onlyReader struct{ r io.Reader }

func (o onlyReader) Read(p []byte) (int, error) { return o.r.Read(p) }

// testDelete: a deleted object is gone from Get, Stat and List, its neighbours stay, and
// deleting what is not there succeeds (cleanup after a crash may run twice).
func testDelete(t *testing.T, s store.Store) {
	ctx := t.Context()
	for _, key := range []string{"runs/j/attempts/1-a/report.md", "runs/j/attempts/1-a/artifacts/x.csv", "runs/j/manifest.json"} {
		if err := s.Put(ctx, key, strings.NewReader(key), int64(len(key))); err != nil {
			t.Fatal(err)
		}
	}
	for _, key := range []string{"runs/j/attempts/1-a/report.md", "runs/j/attempts/1-a/artifacts/x.csv"} {
		if err := s.Delete(ctx, key); err != nil {
			t.Fatalf("Delete(%s): %v", key, err)
		}
		if _, err := s.Stat(ctx, key); !errors.Is(err, store.ErrNotFound) {
			t.Errorf("Stat(%s) after Delete: %v, want ErrNotFound", key, err)
		}
		if err := s.Delete(ctx, key); err != nil {
			t.Errorf("second Delete(%s): %v, want nil", key, err)
		}
	}
	if keys := list(t, s, "runs/j/"); !slices.Equal(keys, []string{"runs/j/manifest.json"}) {
		t.Errorf("List after Delete = %v, want only the manifest", keys)
	}
	// The key is free again, also for a create-only put.
	if err := s.PutIfAbsent(ctx, "runs/j/attempts/1-a/report.md", strings.NewReader("again"), 5); err != nil {
		t.Errorf("PutIfAbsent after Delete: %v", err)
	}
	if err := s.Delete(ctx, "../escape"); !errors.Is(err, store.ErrInvalidKey) {
		t.Errorf("Delete(../escape) = %v, want ErrInvalidKey", err)
	}
}

// testLongArtifactNames: the longest names the worker stores an artifact under (a part of
// NAME_MAX bytes, 512 bytes in all, in an attempt folder of a job id of 64 characters, under a
// tenant's folder) are written create-only, read and listed as themselves: a job names its
// artifacts, and one the store could not hold would fail the commit of its run.
func testLongArtifactNames(t *testing.T, s store.Store) {
	ctx := t.Context()
	run := "tenants/team-a/runs/" + strings.Repeat("j", 64) + "/attempts/12-0a1b2c3d/"
	keys := []string{
		run + "artifacts/" + strings.Repeat("a", 255),
		run + "artifacts/" + strings.Repeat("b", 245) + "/" + strings.Repeat("c", 255),
		run + "artifacts/" + strings.Repeat("é", 125) + ".csv",
	}
	for i, key := range keys {
		data := []byte(fmt.Sprintf("artifact %d\n", i))
		if err := s.PutIfAbsent(ctx, key, bytes.NewReader(data), int64(len(data))); err != nil {
			t.Fatalf("PutIfAbsent of a %d-byte key: %v", len(key), err)
		}
		if got := get(t, s, key); !bytes.Equal(got, data) {
			t.Errorf("Get of a %d-byte key = %q, want %q", len(key), got, data)
		}
	}
	listed, err := s.List(ctx, run)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, o := range listed {
		got = append(got, o.Key)
	}
	want := slices.Clone(keys)
	slices.Sort(want)
	if !slices.Equal(got, want) {
		t.Errorf("List(%s) = %q, want %q", run, got, want)
	}
}
