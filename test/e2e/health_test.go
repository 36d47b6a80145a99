//go:build integration

package e2e

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/boxcar-run/boxcar/internal/demomodel"
	"github.com/boxcar-run/boxcar/test/harness"
)

// TestReadyzWhileDraining: after SIGTERM (here: the worker's context ending) a worker that
// still runs a job answers /readyz 503 "draining" and /healthz 200, so that a kubelet neither
// sends it work nor kills it, until the job has finished.
func TestReadyzWhileDraining(t *testing.T) {
	t.Parallel()
	// A model that holds its first answer until the test lets it go.
	release := make(chan struct{})
	asked := make(chan struct{})
	var once sync.Once
	demo := demomodel.Handler()
	model := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		first := false
		once.Do(func() { first = true; close(asked) })
		if first {
			select {
			case <-release:
			case <-r.Context().Done():
				return
			}
		}
		demo.ServeHTTP(w, r)
	}))
	t.Cleanup(model.Close)
	t.Cleanup(func() {
		select {
		case <-release:
		default:
			close(release)
		}
	})

	w := startWorker(t, model.URL+"/v1")
	wk := w.Worker.Worker // workercmd's: its Stop begins the drain and returns
	base := "http://" + w.Addrs().Metrics

	stdout, stderr, err := w.submit(t, "run", "--profile", "csv-analyst", "--task", "Summarise sales.csv",
		"--input", "../../examples/sales.csv", "--output", "json")
	if err != nil {
		t.Fatalf("submit run: %v\n%s", err, stderr)
	}
	id, _ := lastJSON(t, stdout)["id"].(string)
	select {
	case <-asked:
	case <-time.After(30 * time.Second):
		t.Fatal("the job never reached the model")
	}
	if code, body := httpGet(t, base+"/readyz"); code != http.StatusOK {
		t.Fatalf("/readyz while running a job = %d %s, want 200", code, body)
	}

	wk.Stop() // SIGTERM
	harness.Wait(t, "/readyz answers 503 draining", func() (bool, error) {
		code, body := httpGet(t, base+"/readyz")
		return code == http.StatusServiceUnavailable && strings.Contains(string(body), "draining"), fmt.Errorf("%d %q", code, body)
	})
	if code, body := httpGet(t, base+"/healthz"); code != http.StatusOK {
		t.Errorf("/healthz while draining = %d %s, want 200", code, body)
	}

	close(release)
	select {
	case <-wk.Done():
		if err := wk.Wait(); err != nil {
			t.Fatalf("worker: %v", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the worker did not finish its job and stop")
	}
	if !loggedState(w.Log.String(), id, "succeeded") {
		t.Errorf("job %s did not succeed during the drain:\n%s", id, w.Log.String())
	}
	if resp, err := http.Get(base + "/healthz"); err == nil {
		resp.Body.Close()
		t.Error("/healthz still answers after the worker stopped")
	}
}

// loggedState reports whether the worker's JSON log has a line settling job id in state.
func loggedState(log, id, state string) bool {
	for _, line := range strings.Split(log, "\n") {
		var rec struct {
			JobID string `json:"job_id"`
			State string `json:"state"`
		}
		if json.Unmarshal([]byte(line), &rec) == nil && rec.JobID == id && rec.State == state {
			return true
		}
	}
	return false
}
