//go:build integration

package e2e

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/boxcar-run/boxcar/internal/demomodel"
	"github.com/boxcar-run/boxcar/test/harness"
)

// slowModel is the demo model answering each request after delay, so a job runs long enough
// to be watched and cancelled.
func slowModel(t *testing.T, delay time.Duration) string {
	t.Helper()
	h := demomodel.Handler()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-time.After(delay):
		case <-r.Context().Done():
			return
		}
		h.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	return srv.URL + "/v1"
}

func submitNoWait(t *testing.T, w *worker) string {
	t.Helper()
	stdout, stderr, err := w.submit(t, "run", "--profile", "csv-analyst", "--task", "Summarise sales.csv",
		"--input", "../../examples/sales.csv", "--output", "json")
	if err != nil {
		t.Fatalf("submit run: %v\n%s", err, stderr)
	}
	res := lastJSON(t, stdout)
	if res["state"] != "queued" {
		t.Fatalf("submit run without --wait = %v, want queued", res)
	}
	return res["id"].(string)
}

func TestWatchShowsProgressUntilTheEnd(t *testing.T) {
	t.Parallel()
	// watch reads the status every 250 ms: a step replaced sooner may not show (a tool call
	// of a few ms, the upload), the end always does. The model's turns take 1 s each, so a
	// watch shows some of them unless the machine stalls it for seconds; which ones it shows
	// depends on the machine, so the test asks for one at least.
	w := startWorker(t, slowModel(t, time.Second))
	id := submitNoWait(t, w)
	stdout, stderr, err := w.submit(t, "watch", id)
	if err != nil {
		t.Fatalf("watch: %v\n%s", err, stderr)
	}
	for _, want := range []string{"running (attempt 1", "model turn ", "succeeded"} {
		if !strings.Contains(stderr, want) {
			t.Errorf("watch did not show %q:\n%s", want, stderr)
		}
	}
	if !strings.Contains(stdout, "report: file://") {
		t.Errorf("watch did not say where the report is:\n%s", stdout)
	}
}

func TestCancelARunningJob(t *testing.T) {
	t.Parallel()
	w := startWorker(t, slowModel(t, 2*time.Second))
	id := submitNoWait(t, w)
	harness.Wait(t, "job "+id+" runs", func() (bool, error) {
		out, _, err := w.submit(t, "status", id, "--output", "json")
		if err != nil {
			t.Fatal(err)
		}
		st := lastJSON(t, out)
		return st["state"] == "running", fmt.Errorf("%v", st)
	})
	asked := time.Now()
	if _, stderr, err := w.submit(t, "cancel", id); err != nil {
		t.Fatalf("cancel: %v\n%s", err, stderr)
	}
	_, _, err := w.submit(t, "watch", id)
	if code := exitCode(err); code != 5 {
		t.Fatalf("watch of a cancelled job exited %d (%v), want 5", code, err)
	}
	if d := time.Since(asked); d > 10*time.Second {
		t.Errorf("cancel took %s", d)
	}
	out, _, err := w.submit(t, "status", id, "--output", "json")
	if err != nil {
		t.Fatal(err)
	}
	if st := lastJSON(t, out); st["state"] != "cancelled" {
		t.Errorf("status after cancel = %v", st)
	}
	if _, _, err := w.submit(t, "cancel", id); exitCode(err) != 1 || !strings.Contains(err.Error(), "already ended") {
		t.Errorf("second cancel = %v, want a clear 'already ended'", err)
	}
}
