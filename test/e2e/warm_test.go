//go:build integration

package e2e

import (
	"bytes"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/boxcar-run/boxcar/examples"
	"github.com/boxcar-run/boxcar/test/harness"
)

// lockWatch counts the sandboxes a bubblewrap Root holds, as their lock files come and go
// (inotify: every create and delete, none missed between two looks), and the most at once.
type lockWatch struct {
	f *os.File // the inotify descriptor, non-blocking: its Close ends a Read

	mu         sync.Mutex
	live, peak int
}

var sandboxLock = regexp.MustCompile(`^boxcar-.*-[0-9a-f]{8}\.lock$`)

func watchLocks(t *testing.T, root string) *lockWatch {
	t.Helper()
	fd, err := unix.InotifyInit1(unix.IN_CLOEXEC | unix.IN_NONBLOCK)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := unix.InotifyAddWatch(fd, root, unix.IN_CREATE|unix.IN_DELETE|unix.IN_MOVED_FROM|unix.IN_MOVED_TO); err != nil {
		t.Fatal(err)
	}
	w := &lockWatch{f: os.NewFile(uintptr(fd), "inotify")}
	done := make(chan struct{})
	go w.read(done)
	t.Cleanup(func() { w.f.Close(); <-done })
	return w
}

func (w *lockWatch) read(done chan struct{}) {
	defer close(done)
	buf := make([]byte, 64<<10)
	for {
		n, err := w.f.Read(buf)
		if err != nil || n <= 0 {
			return
		}
		for off := 0; off+unix.SizeofInotifyEvent <= n; {
			ev := (*unix.InotifyEvent)(unsafe.Pointer(&buf[off]))
			name := string(bytes.TrimRight(buf[off+unix.SizeofInotifyEvent:off+unix.SizeofInotifyEvent+int(ev.Len)], "\x00"))
			off += unix.SizeofInotifyEvent + int(ev.Len)
			if !sandboxLock.MatchString(name) {
				continue
			}
			w.mu.Lock()
			if ev.Mask&(unix.IN_CREATE|unix.IN_MOVED_TO) != 0 {
				w.live++
			} else {
				w.live--
			}
			w.peak = max(w.peak, w.live)
			w.mu.Unlock()
		}
	}
}

func (w *lockWatch) counts() (live, peak int) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.live, w.peak
}

// warmWorkerConfig is the example config with a warm pool for csv-analyst and the sandboxes
// under root.
func warmWorkerConfig(t *testing.T, root, warm string) string {
	t.Helper()
	text := strings.Replace(string(examples.Config), "  csv-analyst:\n", "  csv-analyst:\n    warm: "+warm+"\n", 1)
	text += fmt.Sprintf("sandbox:\n  bubblewrap:\n    root: %s\n", root)
	path := filepath.Join(t.TempDir(), "warm.yaml")
	if err := os.WriteFile(path, []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// sandboxRoot is a bubblewrap Root the sandboxes' own users can pass through.
func sandboxRoot(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	for _, d := range []string{filepath.Dir(dir), dir} {
		if err := os.Chmod(d, 0o711); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// metric is the sum of the worker's samples of the metric whose line starts with prefix.
func metric(t *testing.T, url, prefix string) float64 {
	t.Helper()
	resp, err := http.Get(url + "/metrics") //nolint:noctx // a test's one look
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	var sum float64
	for l := range strings.Lines(string(body)) {
		if strings.HasPrefix(l, prefix) {
			fields := strings.Fields(l)
			v, err := strconv.ParseFloat(fields[len(fields)-1], 64)
			if err != nil {
				t.Fatalf("metric line %q: %v", l, err)
			}
			sum += v
		}
	}
	return sum
}

// TestWarmPoolEndToEnd runs a burst of jobs through a worker whose profile keeps warm
// sandboxes, on real bubblewrap and the embedded NATS: the pool fills to its minimum, the jobs
// take warm sandboxes (manifest and status say so, with the claim time), the worker never holds
// more sandboxes than its concurrency (counted on the host, as their lock files come and go),
// the metrics count every take, the pool drains back to its minimum after its idle time, and
// nothing is left once the worker stops.
func TestWarmPoolEndToEnd(t *testing.T) {
	t.Parallel()
	root := sandboxRoot(t)
	locks := watchLocks(t, root)
	w, stop := startWorkerIn(t, t.TempDir(), demoModel(t), "--config", warmWorkerConfig(t, root, "{min: 1, idle: 1s}"),
		"--metrics-addr", "127.0.0.1:0")
	url := w.MetricsURL(t)
	harness.Wait(t, "the pool at its minimum", func() (bool, error) { return metric(t, url, `boxcar_pool_size{profile="csv-analyst"}`) == 1, w.Alive() })

	const jobs = 6
	ids := make([]string, jobs)
	for i := range ids {
		stdout, stderr, err := w.submit(t, "run", "--profile", "csv-analyst", "--task", "Summarise sales.csv",
			"--input", "../../examples/sales.csv", "--output", "json")
		if err != nil {
			t.Fatalf("submit run: %v\n%s", err, stderr)
		}
		ids[i] = lastJSON(t, stdout)["id"].(string)
	}
	warm := 0
	for _, id := range ids {
		stdout, stderr, err := w.submit(t, "watch", id, "--output", "json", "--timeout", "3m")
		if err != nil {
			t.Fatalf("watch %s: %v\n%s", id, err, stderr)
		}
		st := lastJSON(t, stdout)
		if st["state"] != "succeeded" || st["sandbox_claimed_at"] == nil {
			t.Errorf("job %s: %v; want succeeded with its sandbox's claim time", id, st)
		}
		pred := storedManifest(t, w, id).Predicate
		if pred.Sandbox.ClaimedAt.IsZero() || fmt.Sprint(st["sandbox_warm"]) != fmt.Sprint(pred.Sandbox.Warm) {
			t.Errorf("job %s: manifest claimed at %v warm %v, status warm %v", id, pred.Sandbox.ClaimedAt, pred.Sandbox.Warm, st["sandbox_warm"])
		}
		if pred.Sandbox.Warm {
			warm++
			text, _, _ := w.submit(t, "status", id)
			if !strings.Contains(text, "(warm: started ahead, claimed then)") {
				t.Errorf("submit status of warm job %s does not say so:\n%s", id, text)
			}
		}
	}
	if warm == 0 {
		t.Error("no job took a warm sandbox")
	}
	hits, misses := metric(t, url, "boxcar_pool_hits_total"), metric(t, url, "boxcar_pool_misses_total")
	claims := metric(t, url, "boxcar_pool_claim_seconds_count")
	if hits != float64(warm) || hits+misses != jobs || claims != jobs {
		t.Errorf("hits %v, misses %v, claims %v; want %d warm of %d jobs, each claim timed", hits, misses, claims, warm, jobs)
	}
	harness.Wait(t, "the pool drained to its minimum", func() (bool, error) {
		live, _ := locks.counts()
		return live == 1 && metric(t, url, `boxcar_pool_size{profile="csv-analyst"}`) == 1, w.Alive()
	})
	stop()
	live, peak := locks.counts()
	t.Logf("%d of %d jobs warm (hits %v, misses %v); at most %d sandboxes at once", warm, jobs, hits, misses, peak)
	if peak > 2 {
		t.Errorf("the worker held %d sandboxes at once, more than its concurrency of 2", peak)
	}
	if live != 0 {
		t.Errorf("%d sandboxes left after the worker stopped", live)
	}
}
