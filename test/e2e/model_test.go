//go:build integration

package e2e

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/boxcar-run/boxcar/internal/demomodel"
	"github.com/boxcar-run/boxcar/internal/job"
	"github.com/boxcar-run/boxcar/test/testworker"
)

// stoppedModel is the demo model behind a switch: while down every connection is closed
// unanswered, probes included, as a stopped server's would be refused.
func stoppedModel(t *testing.T, down *atomic.Bool) string {
	t.Helper()
	model := demomodel.Handler()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !down.Load() {
			model.ServeHTTP(w, r)
			return
		}
		if c, _, err := w.(http.Hijacker).Hijack(); err == nil {
			c.Close()
		}
	}))
	t.Cleanup(srv.Close)
	return srv.URL + "/v1"
}

// TestModelOutageKeepsTheDelivery: a job that meets a model outage waits in its turn, its
// delivery kept past AckWait, while /readyz says the model is down and boxcar_model_up reads 0;
// with max_deliver 1 a delivery spent would be a dead job. When the model answers again the
// job succeeds at its first delivery and the worker is ready again.
func TestModelOutageKeepsTheDelivery(t *testing.T) {
	t.Parallel()
	var down atomic.Bool
	ns := startNATS(t)
	storeDir := t.TempDir()
	// Heartbeats come every third of it: a worker stalled for seconds on a busy machine (seen
	// at 2s: a 3s stall spent the only delivery) must not lose the job for that.
	const ackWait = 5 * time.Second
	w := launchWorker(t, testworker.Config{NATS: ns.ClientURL(), NATSYAML: fmt.Sprintf("ack_wait: %s\nmax_deliver: 1", ackWait),
		Store: "file://" + storeDir, Model: stoppedModel(t, &down), Args: []string{"--log-level", "debug"}})
	w.WaitReady(t)
	base := w.MetricsURL(t)

	down.Store(true)
	out, err := submitWith(t, w.Submit, "run", "--profile", "csv-analyst", "--task", "Summarise", "--output", "json")
	if err != nil {
		t.Fatalf("submit: %v\n%s", err, out)
	}
	id := lastJSON(t, out)["id"].(string)
	waitReadyz(t, base+"/readyz", regexp.MustCompile(`^not ready: model: model endpoint down since \S+ \(no response`), 60*time.Second, w.Alive)
	if m := waitHTTP(t, base+"/metrics", 200, 10*time.Second, w.Alive); !strings.Contains(m, "\nboxcar_model_up 0\n") {
		t.Errorf("boxcar_model_up is not 0 while the model is down:\n%s", grepLines(m, "boxcar_model_up"))
	}
	waitDeliveryKept(t, ns.ClientURL(), 3*ackWait)

	down.Store(false)
	done := waitStatus(t, w.Submit, id, 90*time.Second, func(s map[string]any) bool {
		return job.State(fmt.Sprint(s["state"])).Terminal()
	})
	if done["state"] != "succeeded" || done["attempt"] != float64(1) {
		t.Errorf("after the model came back: %v, want succeeded on attempt 1", done)
	}
	if dl, ok := deadLetter(t, ns.ClientURL(), id); ok {
		t.Errorf("a job that only waited for the model was dead-lettered: %+v", dl)
	}
	waitHTTP(t, base+"/readyz", 200, 60*time.Second, w.Alive)
	if m := waitHTTP(t, base+"/metrics", 200, 10*time.Second, w.Alive); !strings.Contains(m, "\nboxcar_model_up 1\n") {
		t.Errorf("boxcar_model_up is not 1 after the model came back:\n%s", grepLines(m, "boxcar_model_up"))
	}
	if n := w.Log.Count(regexp.MustCompile(`"msg":"model endpoint down; holding model requests and new jobs`)); n != 1 {
		t.Errorf("worker logged the outage %d times, want 1", n)
	}
}

// grepLines returns the lines of s that hold sub.
func grepLines(s, sub string) string {
	var out []string
	for l := range strings.SplitSeq(s, "\n") {
		if strings.Contains(l, sub) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}
