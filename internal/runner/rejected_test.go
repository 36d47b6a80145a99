package runner_test

import (
	"context"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/boxcar-run/boxcar/internal/agent"
	"github.com/boxcar-run/boxcar/internal/job"
	"github.com/boxcar-run/boxcar/internal/runner"
	"github.com/boxcar-run/boxcar/internal/store"
)

// TestRejectedMessageStatusSaysWhy (issue 12): a message published without submit that the
// worker rejects gets a status a user can look up, under the id its subject names or, when that
// is unusable, under its stream sequence (stream-seq-N, the sequence the publisher's ack
// reports; never the id its JSON names, which may be another job's), and the status's error
// says what to fix.
func TestRejectedMessageStatusSaysWhy(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.worker(agentFunc(writeReport))
	ctx := context.Background()
	js, err := jetstream.New(b.nc)
	if err != nil {
		t.Fatal(err)
	}
	taken := b.submit("p")
	b.waitFinal(taken.ID, 30*time.Second)

	body := func(id string) string {
		return `{"version":1,"id":"` + id + `","profile":"p","task":"t","submitted_at":"2026-01-01T00:00:00Z"}`
	}
	tests := []struct {
		name, subjectID, body string
		// under is the status's id; empty means stream-seq-N.
		under string
		want  []string // in the status's error
	}{
		{name: "uppercase subject id", subjectID: "PLAIN-000002", body: body("plain-000002"), want: []string{`"PLAIN-000002"`, `"plain-000002"`, "must be equal"}},
		{name: "subject of another id", subjectID: "other-000003", body: body("plain-000003"), under: "other-000003", want: []string{`"other-000003"`, `"plain-000003"`, "boxcar.jobs.default.plain-000003"}},
		{name: "uppercase JSON id and subject", subjectID: "PLAIN-000004", body: body("PLAIN-000004"), want: []string{"PLAIN-000004"}},
		{name: "not JSON", subjectID: "NOT-JSON", body: "profile=p task=t", want: []string{"invalid"}},
		{name: "names a job that has a status", subjectID: "TAKEN", body: body(taken.ID), want: []string{`"TAKEN"`, "must be equal"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ack, err := js.Publish(ctx, b.cfg.NATS.Subject+".default."+tt.subjectID, []byte(tt.body))
			if err != nil {
				t.Fatal(err)
			}
			id := tt.under
			if id == "" {
				id = fmt.Sprintf("stream-seq-%d", ack.Sequence)
			}
			var st job.Status
			waitFor(t, 10*time.Second, "a status under "+id, func() bool {
				st, err = b.q.Status(ctx, id)
				return err == nil && st.State == job.StateRejected
			})
			for _, w := range tt.want {
				if !strings.Contains(st.Error, w) {
					t.Errorf("status %s error %q, want it to say %q", id, st.Error, w)
				}
			}
		})
	}
	if st, err := b.q.Status(ctx, taken.ID); err != nil || st.State != job.StateSucceeded {
		t.Errorf("the job a rejected message named: %s, %v; want it still succeeded", st.State, err)
	}
}

// TestRejectedMessageCannotTakeOverAQueuedJob: a queued job has no status (submit writes
// none). A malformed message of the same tenant on a subject with no usable id (uppercase)
// whose JSON names the queued job's id is rejected; were its rejection recorded under that
// JSON id (no status existed under it yet), the queued job's own delivery would find a final
// status and be acknowledged without running, its status carrying the other message's error.
// The rejection goes under the message's stream sequence: a message cannot end or overwrite
// another job's status by naming its id.
func TestRejectedMessageCannotTakeOverAQueuedJob(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	js, err := jetstream.New(b.nc)
	if err != nil {
		t.Fatal(err)
	}
	legit := b.newJob("p", "t")
	// The store answers slowly for the legit job's claim (its committed-run check) until
	// the malformed message has been handled: a busy store, not a fault.
	slow := &hookStore{Store: b.shared}
	var bad atomic.Bool
	slow.stat = func(key string) error {
		if strings.Contains(key, legit.ID) && !bad.Load() {
			return errStoreDown
		}
		return nil
	}
	var ran atomic.Int32
	b.publish(legit)
	body := `{"version":1,"id":"` + legit.ID + `","profile":"p","task":"t","submitted_at":"2026-01-01T00:00:00Z"}`
	if _, err := js.Publish(ctx, b.cfg.NATS.Subject+".default."+strings.ToUpper(legit.ID), []byte(body)); err != nil {
		t.Fatal(err)
	}
	b.worker(agentFunc(func(ctx context.Context, req agent.Request) (agent.Result, error) {
		if req.JobID == legit.ID {
			ran.Add(1)
		}
		return writeReport(ctx, req)
	}), func(c *runner.Config) { c.Store = slow })
	waitFor(t, 20*time.Second, "the malformed message's dead letter", func() bool {
		for _, dl := range b.deadLetters() {
			if dl.JobID == strings.ToUpper(legit.ID) {
				return true
			}
		}
		return false
	})
	bad.Store(true)
	st := b.waitFinal(legit.ID, 30*time.Second)
	waitFor(t, 20*time.Second, "the job stream to be drained", b.consumed)
	_, mErr := b.store.Stat(ctx, store.ManifestKey(legit.ID))
	if st.State != job.StateSucceeded || ran.Load() == 0 {
		t.Errorf("queued job %s submitted correctly ended %s (error %q), agent ran %d times, manifest: %v; want it run and succeeded: "+
			"another message of the tenant, rejected, took over its status", legit.ID, st.State, st.Error, ran.Load(), mErr)
	}
}
