//go:build integration

package submitcmd

import (
	"bytes"
	"strings"
	"testing"

	"github.com/boxcar-run/boxcar/internal/job"
	"github.com/boxcar-run/boxcar/internal/store"
	"github.com/boxcar-run/boxcar/internal/store/s3test"
	"github.com/boxcar-run/boxcar/test/harness"
)

// TestRunRidesOutStoreOutage: the store (versitygw) is down when run starts uploading and
// comes back; run waits, says for what, uploads the input and queues the job once.
func TestRunRidesOutStoreOutage(t *testing.T) {
	srv := s3test.Start(t)
	srv.Env(t)
	bucket := srv.CreateBucket(t)
	te := newTestEnv(t)
	input := writeTestFile(t, t.TempDir(), "sales.csv", "region,total\nnorth,3\n")
	srv.Stop()

	var stdout bytes.Buffer
	var stderr harness.LogBuffer
	done := make(chan error, 1)
	go func() {
		done <- Run(t.Context(), []string{"run", "--profile", "csv-analyst", "--task", "t", "--input", input, "--timeout", "3m",
			"--store", "s3://" + bucket, "--s3-endpoint", srv.Endpoint}, te.getenv, &stdout, &stderr)
	}()
	waitFor(t, "run to say it waits for the store", func() bool { return strings.Contains(stderr.String(), "waiting for the store") })
	srv.Restart(t)
	if err := <-done; err != nil {
		t.Fatalf("run across a store outage: %v\n%s", err, stderr.String())
	}
	id := strings.TrimSpace(stdout.String())
	if !job.ValidID(id) || te.jobMessages(t) != 1 || !strings.Contains(stderr.String(), "answered after") {
		t.Errorf("run: stdout %q, stderr %q, %d jobs queued; want one job and what it waited for", stdout.String(), stderr.String(), te.jobMessages(t))
	}
	st, err := store.Open(t.Context(), "s3://"+bucket, store.Options{Endpoint: srv.Endpoint, PathStyle: true})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	if keys := listKeys(t, st, store.TenantPrefix(job.DefaultTenant)+"inputs/"); len(keys) != 1 {
		t.Errorf("inputs in the store: %v, want the one input", keys)
	}
}
