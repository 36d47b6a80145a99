package runner_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"fmt"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/boxcar-run/boxcar/internal/job"
	"github.com/boxcar-run/boxcar/internal/provenance"
	"github.com/boxcar-run/boxcar/internal/store"
)

// TestPlantedManifestsAddNoMetricSeries: a tenant may write its runs/ (it owns its bucket,
// docs/security.md), and a manifest it puts in a job's folder before the job runs makes the
// worker end the job as the manifest says (TestCommittedManifestNoWorkerBuiltIsNeverSigned).
// The manifest's outcome reason and state are the tenant's choice: as labels of
// boxcar_dead_letters_total and boxcar_jobs_total they would add a series per job for the
// worker's life. They are counted as "other", as an unknown profile is "unknown".
func TestPlantedManifestsAddNoMetricSeries(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	w := b.worker(agentFunc(writeReport))
	const jobs = 20
	var ids []string
	for i := range jobs {
		j := b.newJob("p", "t")
		tr := []byte("{}\n")
		sum := fmt.Sprintf("%x", sha256.Sum256(tr))
		if err := b.store.PutIfAbsent(ctx, store.AttemptPrefix(j.ID, "1-planted0")+"transcript.jsonl", bytes.NewReader(tr), int64(len(tr))); err != nil {
			t.Fatal(err)
		}
		out := provenance.Outcome{State: job.StateFailed, Reason: fmt.Sprintf("tenant-chosen-%d-%s", i, j.ID), Error: "planted"}
		if i%2 == 1 {
			out.State = job.StateDead // a known reason, kept as it is
			out.Reason = "max_deliveries"
		}
		ids = append(ids, j.ID)
		planted, err := provenance.Build(provenance.Manifest{
			Job:     provenance.Job{ID: j.ID, Profile: "p", Task: "t"},
			Outcome: out,
		}, []provenance.Subject{{Name: "transcript.jsonl", Path: "attempts/1-planted0/transcript.jsonl", SHA256: sum, Size: int64(len(tr))}})
		if err != nil {
			t.Fatal(err)
		}
		if err := b.store.PutIfAbsent(ctx, store.ManifestKey(j.ID), bytes.NewReader(planted), int64(len(planted))); err != nil {
			t.Fatal(err)
		}
		b.publish(j)
	}
	for _, id := range ids {
		b.waitFinal(id, 20*time.Second)
	}
	waitFor(t, 10*time.Second, "the jobs settled", b.consumed)
	if n := testutil.CollectAndCount(w.m.DeadLetters); n != 2 {
		t.Errorf("boxcar_dead_letters_total has %d series after %d jobs whose planted manifests named a reason each, want 2 (other, max_deliveries): a label value the tenant chose is one series per job for the worker's life", n, jobs)
	}
	for reason, want := range map[string]float64{"other": jobs / 2, "max_deliveries": jobs / 2} {
		if got := testutil.ToFloat64(w.m.DeadLetters.WithLabelValues(reason)); got != want {
			t.Errorf("boxcar_dead_letters_total{reason=%q} = %v, want %v", reason, got, want)
		}
	}
}
