package submitcmd

import (
	"bytes"
	"encoding/json"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/boxcar-run/boxcar/internal/job"
	"github.com/boxcar-run/boxcar/internal/store"
)

// crashPut, in the environment, makes TestGCHelperCrashingPut a worker's upload that dies
// mid-body: it puts an object create-only, as a worker's commit does, whose body gives
// crashPutSent bytes and then hangs until the process is killed.
const crashPut = "BOXCAR_TEST_CRASHING_PUT"

const crashPutSent = 6 << 20 // more than one S3 part of 5 MiB

type crashPutArgs struct {
	URL, Endpoint, Key string
	Size               int64
}

// hangingBody gives n bytes, then blocks for ever.
type hangingBody struct{ n int }

func (h *hangingBody) Read(p []byte) (int, error) {
	if h.n == 0 {
		select {} // the worker is killed here
	}
	k := min(len(p), h.n)
	clear(p[:k])
	h.n -= k
	return k, nil
}

// TestGCHelperCrashingPut is the child process of the crash tests; it does nothing otherwise.
func TestGCHelperCrashingPut(t *testing.T) {
	raw := os.Getenv(crashPut)
	if raw == "" {
		t.Skip("a helper process")
	}
	var a crashPutArgs
	if err := json.Unmarshal([]byte(raw), &a); err != nil {
		t.Fatal(err)
	}
	st, err := store.Open(t.Context(), a.URL, store.Options{Endpoint: a.Endpoint, PathStyle: a.Endpoint != ""})
	if err != nil {
		t.Fatal(err)
	}
	st = store.ForTenant(st, job.DefaultTenant)
	err = st.PutIfAbsent(t.Context(), a.Key, &hangingBody{n: crashPutSent}, a.Size)
	t.Fatalf("the put returned (%v); it should hang until killed", err)
}

// crashMidPut runs a worker's upload of key in a child process and kills it (SIGKILL, as the
// OOM killer or a node loss does) once landed says its first bytes reached the store.
func crashMidPut(t *testing.T, a crashPutArgs, landed func() bool) {
	t.Helper()
	raw, _ := json.Marshal(a)
	cmd := exec.Command(os.Args[0], "-test.run", "^TestGCHelperCrashingPut$", "-test.count=1")
	cmd.Env = append(os.Environ(), crashPut+"="+string(raw))
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	deadline := time.Now().Add(30 * time.Second)
	for !landed() {
		select {
		case err := <-exited:
			t.Fatalf("the uploading process ended before it was killed: %v\n%s", err, out.String())
		default:
		}
		if time.Now().After(deadline) {
			_ = cmd.Process.Kill()
			<-exited
			t.Fatalf("the upload never reached the store\n%s", out.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
	_ = cmd.Process.Kill()
	<-exited
}

// filesUnder lists the regular files under dir with their sizes.
func filesUnder(t *testing.T, dir string) map[string]int64 {
	t.Helper()
	got := map[string]int64{}
	_ = filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err == nil && d.Type().IsRegular() {
			if info, err := d.Info(); err == nil {
				got[strings.TrimPrefix(p, dir)] = info.Size()
			}
		}
		return nil
	})
	return got
}

// TestGCReclaimsACrashedUploadsPartialFile: a worker killed in the middle of an upload to the
// file store (the OOM killer, a node lost) leaves the object's temporary file, as big as what
// it had written, next to where the object would be, which List never shows. gc --delete
// removes it with the folder's objects, and the folders left empty: otherwise it would stay
// for ever, one per crash, each up to max_artifact_bytes or max_transcript_bytes.
func TestGCReclaimsACrashedUploadsPartialFile(t *testing.T) {
	te := newTestEnv(t)
	ctx := t.Context()
	committed := te.commitRun(t, true)
	crashed := store.AttemptPrefix(committed, "2-deadbeef")
	if err := te.st.PutIfAbsent(ctx, crashed+"report.md", strings.NewReader("# r\n"), 4); err != nil {
		t.Fatal(err)
	}
	folder := filepath.Join(te.storeDir, "tenants", "default", filepath.FromSlash(crashed))
	crashMidPut(t, crashPutArgs{URL: "file://" + te.storeDir, Key: crashed + "artifacts/big.bin", Size: 8 << 20}, func() bool {
		for name, size := range filesUnder(t, folder) {
			if strings.Contains(name, ".boxcar-tmp-") && size >= crashPutSent {
				return true
			}
		}
		return false
	})
	// Two days later, everything of the run is old.
	old := time.Now().Add(-48 * time.Hour)
	_ = filepath.WalkDir(filepath.Join(te.storeDir, "tenants", "default", filepath.FromSlash(store.RunPrefix(committed))), func(p string, d fs.DirEntry, err error) error {
		if err == nil {
			_ = os.Chtimes(p, old, old)
		}
		return nil
	})
	stdout, stderr, err := te.submit(t, "gc", "--delete")
	if err != nil {
		t.Fatalf("gc --delete: %v\n%s%s", err, stdout, stderr)
	}
	if !strings.Contains(stdout, "deleted       "+crashed) {
		t.Fatalf("gc --delete did not delete the crashed attempt's folder:\n%s", stdout)
	}
	if left := filesUnder(t, folder); len(left) > 0 {
		var dirs []string
		_ = filepath.WalkDir(folder, func(p string, d fs.DirEntry, err error) error {
			if err == nil && d.IsDir() {
				dirs = append(dirs, strings.TrimPrefix(p, folder)+"/")
			}
			return nil
		})
		t.Errorf("after gc --delete removed the crashed attempt's folder, the store still holds in it %v (bytes), in the folders %q: the partial upload of the killed worker is never reclaimed\n%s", left, dirs, stdout)
	}
}

// TestGCReclaimsAKilledSubmitsInputUpload: a `submit run` killed while it uploaded an input
// leaves the input's temporary file under inputs/, outside every attempt folder, and no job
// names it. gc lists it and keeps it while it is within the grace (its upload may be live),
// and once it is older, gc --delete removes it; before, nothing ever did on the file store.
func TestGCReclaimsAKilledSubmitsInputUpload(t *testing.T) {
	te := newTestEnv(t)
	key := store.InputKey(strings.Repeat("ab", 32))
	tenantDir := filepath.Join(te.storeDir, "tenants", "default")
	temps := func() map[string]int64 {
		got := map[string]int64{}
		for name, size := range filesUnder(t, tenantDir) {
			if strings.Contains(name, ".boxcar-tmp-") {
				got[name] = size
			}
		}
		return got
	}
	crashMidPut(t, crashPutArgs{URL: "file://" + te.storeDir, Key: key, Size: 8 << 20}, func() bool {
		for _, size := range temps() {
			if size >= crashPutSent {
				return true
			}
		}
		return false
	})
	checkGCOfInputUpload(t, te, nil, func() int { return len(temps()) }, func(at time.Time) {
		_ = filepath.WalkDir(filepath.Join(tenantDir, "inputs"), func(p string, d fs.DirEntry, err error) error {
			if err == nil {
				_ = os.Chtimes(p, at, at)
			}
			return nil
		})
	})
}

// checkGCOfInputUpload runs gc --delete on a store holding one unfinished upload of an input
// (left tells how many there are): while it is new gc keeps it, and once age has made it two
// days old gc deletes it.
func checkGCOfInputUpload(t *testing.T, te *testEnv, args []string, left func() int, age func(time.Time)) {
	t.Helper()
	gc := func() string {
		stdout, stderr, err := te.submit(t, append([]string{"gc", "--delete"}, args...)...)
		if err != nil {
			t.Fatalf("gc --delete: %v\n%s%s", err, stdout, stderr)
		}
		return stdout
	}
	out := gc()
	if left() != 1 || !strings.Contains(out, "kept") || !strings.Contains(out, "inputs/sha256/") || !strings.Contains(out, "within the grace") {
		t.Fatalf("gc --delete with the unfinished input upload just written: %d left; want it listed as kept within the grace\n%s", left(), out)
	}
	age(time.Now().Add(-48 * time.Hour))
	out = gc()
	if n := left(); n != 0 || !strings.Contains(out, "deleted") || !strings.Contains(out, "inputs/sha256/") {
		t.Errorf("gc --delete with the unfinished input upload two days old: %d left; want it deleted and listed\n%s", n, out)
	}
}
