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

// TestAuditGrowthPlantedReasonsGrowDeadLetterSeries: a tenant may write its runs/ (it owns its
// bucket, docs/security.md), and a manifest it puts in a job's folder before the job runs
// makes the worker end the job as the manifest says (TestCommittedManifestNoWorkerBuiltIsNever
// Signed). The manifest's outcome reason becomes the label of boxcar_dead_letters_total as it
// is: one new series per job, for the worker's life, with a value the tenant chose. The
// profile label is guarded against exactly that (settleMetrics: "unknown"); the reason is not.
func TestAuditGrowthPlantedReasonsGrowDeadLetterSeries(t *testing.T) {
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
		planted, err := provenance.Build(provenance.Manifest{
			Job:     provenance.Job{ID: j.ID, Profile: "p", Task: "t"},
			Outcome: provenance.Outcome{State: job.StateFailed, Reason: fmt.Sprintf("tenant-chosen-%d-%s", i, j.ID), Error: "planted"},
		}, []provenance.Subject{{Name: "transcript.jsonl", Path: "attempts/1-planted0/transcript.jsonl", SHA256: sum, Size: int64(len(tr))}})
		if err != nil {
			t.Fatal(err)
		}
		if err := b.store.PutIfAbsent(ctx, store.ManifestKey(j.ID), bytes.NewReader(planted), int64(len(planted))); err != nil {
			t.Fatal(err)
		}
		b.publish(j)
		ids = append(ids, j.ID)
	}
	for _, id := range ids {
		b.waitFinal(id, 20*time.Second)
	}
	waitFor(t, 10*time.Second, "the jobs settled", b.consumed)
	if n := testutil.CollectAndCount(w.m.DeadLetters); n > 1 {
		t.Errorf("boxcar_dead_letters_total has %d series after %d jobs whose planted manifests named a reason each: a label value the tenant chose, one series per job for the worker's life", n, jobs)
	}
}
