package sandboxtest

import (
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/boxcar-run/boxcar/internal/sandbox"
)

// hostileShapes are what a job can leave in its workdir for the worker to read: each must give
// a clear answer at once, never a hang, a file from outside, or a listing that fails whole.
var hostileShapes = []suiteTest{
	{"ReadFileNotRegular", testReadFileNotRegular},
	{"ListLeavesOutWhatItCannotRead", testListLeavesOut},
}

func testReadFileNotRegular(t *testing.T, p sandbox.Provider) {
	sb := Start(t, p)
	Sh(t, sb, "mkfifo fifo && mkdir folder && ln -s loop loop && ln -s /dev/zero device && ln -s fifo fifolink")
	for _, name := range []string{"fifo", "folder", "loop", "device", "fifolink"} {
		begin := time.Now()
		data, err := sb.ReadFile(t.Context(), name, 1<<20)
		if err == nil {
			t.Errorf("ReadFile %s = %q, want an error: it is no regular file inside the workdir", name, data)
		}
		if errors.Is(err, sandbox.ErrNotFound) && name != "loop" {
			t.Errorf("ReadFile %s: err = %v; it exists, so not ErrNotFound", name, err)
		}
		if took := time.Since(begin); took > 10*time.Second {
			t.Errorf("ReadFile %s took %v; a FIFO must not block the worker", name, took)
		}
	}
}

// testListLeavesOut nests folders past PATH_MAX (25 levels of 200 bytes) beside a plain file:
// List returns the plain file, and the deep one too or an *IncompleteError naming what it left
// out in a short name; never a failure of the whole listing.
func testListLeavesOut(t *testing.T, p sandbox.Provider) {
	sb := Start(t, p)
	if err := sb.WriteFile(t.Context(), "out/ok.txt", []byte("ok")); err != nil {
		t.Fatal(err)
	}
	Sh(t, sb, `cd out && n=$(printf 'd%.0s' $(seq 200)) && for i in $(seq 25); do mkdir "$n" && cd -P "$n" || exit 1; done && echo deep > deep.txt`)
	files, err := sb.List(t.Context(), "out")
	var incomplete *sandbox.IncompleteError
	if err != nil && !errors.As(err, &incomplete) {
		t.Fatalf("List: %v, want the files, and an *IncompleteError at most", err)
	}
	var paths []string
	deep := false
	for _, f := range files {
		paths = append(paths, f.Path)
		deep = deep || strings.HasSuffix(f.Path, "/deep.txt")
	}
	if !slices.Contains(paths, "out/ok.txt") {
		t.Errorf("List = %q, want out/ok.txt among them", paths)
	}
	if !deep && incomplete == nil {
		t.Errorf("List = %q, no error: the deep file is neither listed nor named as left out", paths)
	}
	if incomplete != nil {
		if !errors.Is(err, sandbox.ErrIncomplete) || len(incomplete.Skipped) == 0 {
			t.Errorf("IncompleteError %+v names nothing", incomplete)
		}
		for _, s := range incomplete.Skipped {
			if !strings.HasPrefix(s.Path, "out") || len(s.Path) > 300 || s.Reason == "" {
				t.Errorf("left out %q (%s): want a path under out/ of at most 300 bytes, and why", s.Path, s.Reason)
			}
		}
		t.Logf("left out: %v", err)
	}
}
