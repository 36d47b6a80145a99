package runner_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/boxcar-run/boxcar/internal/job"
)

// statusesUntilFinal is every status of the job its tenant's watch shows until a final one,
// the dead letter's error and reason, and the committed manifest's outcome and transcript, as
// texts the tenant reads.
func (b *bundle) statusesUntilFinal(id string, within time.Duration) []string {
	b.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), within)
	defer cancel()
	updates, err := b.q.WatchStatus(ctx, id)
	if err != nil {
		b.t.Fatal(err)
	}
	var seen []string
	var last job.Status
	for st := range updates {
		last = st
		seen = append(seen, fmt.Sprintf("status %s: error %q, progress %q", st.State, st.Error, st.Progress))
	}
	if !last.State.Terminal() {
		b.t.Fatalf("job %s did not end within %s; last status %+v", id, within, last)
	}
	if last.State != job.StateDead && last.State != job.StateFailed {
		b.t.Fatalf("job %s ended %s (%s); want dead or failed", id, last.State, last.Error)
	}
	for _, dl := range b.settledLetters() {
		if dl.JobID == id {
			seen = append(seen, fmt.Sprintf("dead letter %s: %q", dl.Reason, dl.Error))
		}
	}
	out := b.manifest(id).Predicate.Outcome
	seen = append(seen, fmt.Sprintf("manifest %s: %q", out.Reason, out.Error), "transcript: "+string(b.runFile(id, "transcript.jsonl")))
	return seen
}

// hostPaths are the worker's side of a failure: paths on its host, a node's name, a pod's
// events.
type hostPaths []string

// notIn fails the test for every text the tenant reads that names one of them.
func (h hostPaths) notIn(t *testing.T, texts ...string) {
	t.Helper()
	for _, text := range texts {
		for _, p := range h {
			if strings.Contains(text, p) {
				t.Errorf("the tenant reads %q in: %s", p, text)
			}
		}
	}
	if len(texts) > 0 {
		t.Logf("the tenant reads:\n%s", strings.Join(texts, "\n"))
	}
}

// inALogLine fails the test unless one line of the worker's log names the first of them with
// the job's id and tenant.
func (h hostPaths) inALogLine(t *testing.T, logs, id, tenant string) {
	t.Helper()
	for _, l := range strings.Split(logs, "\n") {
		if strings.Contains(l, h[0]) && strings.Contains(l, `"job_id":"`+id+`"`) && strings.Contains(l, `"tenant":"`+tenant+`"`) {
			return
		}
	}
	t.Errorf("no line of the worker's log names %s with job %s of tenant %s:\n%s", h[0], id, tenant, logs)
}
