//go:build integration

package e2e

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/boxcar-run/boxcar/examples"
	"github.com/boxcar-run/boxcar/internal/job"
	"github.com/boxcar-run/boxcar/internal/store/s3test"
	"github.com/boxcar-run/boxcar/internal/workercmd"
	"github.com/boxcar-run/boxcar/test/harness"
	"github.com/boxcar-run/boxcar/test/testworker"
)

// TestWorkerRefusesAStoreThatOverwrites (issue 10 item 7): on an S3 server that ignores
// If-None-Match (a proxy in front of versitygw plays one), the worker does not start, and says
// what the server does and which setting runs it anyway; with that setting it starts and warns.
func TestWorkerRefusesAStoreThatOverwrites(t *testing.T) {
	t.Parallel()
	s3 := s3test.Start(t)
	bucket := s3.CreateBucket(t)
	lenient := s3test.NewLenientProxy(t, s3, s3test.IgnorePut)
	ns := startNATS(t)
	sections := func(extra string) string {
		return fmt.Sprintf("nats:\n  url: %s\nstore:\n  url: s3://%s\n  endpoint: %s\n  region: %s\n  path_style: true\n%s",
			ns.ClientURL(), bucket, lenient.URL, s3test.Region, extra)
	}

	cfg := filepath.Join(t.TempDir(), "boxcar.yaml")
	writeText(t, cfg, string(examples.Config)+"\nsandbox:\n  backend: bubblewrap\n"+sections(""))
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	log := &harness.LogBuffer{}
	env := harness.Env(s3.Vars()).With("OPENAI_BASE_URL", demoModel(t), "OPENAI_API_KEY", testworker.APIKey).Getenv
	err := workercmd.Run(ctx, []string{"--config", cfg, "--metrics-addr", "127.0.0.1:0"}, env, &harness.LogBuffer{}, log)
	if err == nil || ctx.Err() != nil {
		t.Fatalf("worker on a server that ignores If-None-Match: %v; want it to refuse to start\n%s", err, log.String())
	}
	for _, want := range []string{"If-None-Match", "store.allow_unsafe_overwrite"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("the worker's error does not name %q: %v", want, err)
		}
	}
	w := launchS3Worker(t, s3, lenient.URL, ns.ClientURL(), "", "allow_unsafe_overwrite: true")
	w.WaitReady(t)
	if n := w.Log.Count(regexp.MustCompile(`"level":"WARN","msg":"store: the S3 server does not honour create-only writes`)); n != 1 {
		t.Errorf("the worker warned %d times about the unsafe server, want once:\n%s", n, w.Log.String())
	}
}

// TestStoreThatStopsRefusingOverwrites: a server that honoured If-None-Match when the worker
// started and stops later (reconfigured, or replaced behind the same address) is found by the
// proof the worker repeats every store.probe_interval: /readyz goes not ready, naming what the
// server does and the setting, and a job delivered meanwhile waits, its delivery kept, and
// commits nothing until the server refuses overwrites again. With max_deliver 1, a delivery
// spent would be a dead job.
func TestStoreThatStopsRefusingOverwrites(t *testing.T) {
	t.Parallel()
	s3 := s3test.Start(t)
	proxy := s3test.NewLenientProxy(t, s3, s3test.IgnoreNothing)
	ns := startNATS(t)
	// 5 s, not 2: under a loaded race run one heartbeat came late, and with max_deliver 1 a
	// redelivery is a dead job.
	const ackWait = 5 * time.Second
	w := launchS3Worker(t, s3, proxy.URL, ns.ClientURL(), fmt.Sprintf("ack_wait: %s\nmax_deliver: 1", ackWait), "probe_interval: 200ms")
	bucket := strings.TrimPrefix(w.Submit["BOXCAR_STORE"], "s3://")
	w.WaitReady(t)
	readyz := w.MetricsURL(t) + "/readyz"
	waitHTTP(t, readyz, 200, 30*time.Second, w.Alive)

	proxy.Ignore(s3test.IgnorePut)
	body := waitReadyz(t, readyz, regexp.MustCompile(`^not ready: store: .*If-None-Match`), 30*time.Second, w.Alive)
	if !strings.Contains(body, "store.allow_unsafe_overwrite") {
		t.Errorf("/readyz on a server that stopped refusing overwrites = %q, want it to name store.allow_unsafe_overwrite", body)
	}

	// submit talks to versitygw itself: only the worker's store is behind the proxy.
	out, err := submitWith(t, w.Submit, "run", "--profile", "csv-analyst", "--task", "Summarise sales.csv",
		"--input", "../../examples/sales.csv", "--output", "json")
	if err != nil {
		t.Fatalf("submit: %v\n%s", err, out)
	}
	id := lastJSON(t, out)["id"].(string)
	s := waitStatus(t, w.Submit, id, 30*time.Second, func(s map[string]any) bool { return s["error"] != nil })
	if e, _ := s["error"].(string); job.State(fmt.Sprint(s["state"])).Terminal() || !strings.HasPrefix(e, "waiting for the store: ") {
		t.Errorf("status of a job delivered while the store overwrites = %v, want it waiting", s)
	}
	// The worker logs the wait as it begins, with the store's error, before it notes it in the
	// status read above.
	if n := w.Log.Count(regexp.MustCompile(`"msg":"waiting for the store before the job can start; the delivery is kept","job_id":"` + id + `".*If-None-Match`)); n != 1 {
		t.Errorf("the worker logged the job's wait for the store %d times, want once:\n%s", n, w.Log.String())
	}
	// Once the server has seen the delivery kept past AckWait twice over, still the first,
	// nothing of the run is in the bucket (versitygw keeps objects as files).
	waitDeliveryKept(t, ns.ClientURL(), 2*ackWait)
	if _, err := os.Stat(filepath.Join(s3.Dir, bucket, "tenants", "default", "runs", id)); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the worker wrote under tenants/default/runs/%s on a server that overwrites: %v", id, err)
	}

	proxy.Ignore(s3test.IgnoreNothing)
	waitHTTP(t, readyz, 200, 30*time.Second, w.Alive)
	done := waitStatus(t, w.Submit, id, 90*time.Second, func(s map[string]any) bool {
		return job.State(fmt.Sprint(s["state"])).Terminal()
	})
	if done["state"] != "succeeded" || done["attempt"] != float64(1) {
		t.Errorf("after the server refused overwrites again: %v, want succeeded on attempt 1", done)
	}
	if dl, ok := deadLetter(t, ns.ClientURL(), id); ok {
		t.Errorf("a job that waited for a safe store was dead-lettered: %+v", dl)
	}
}
