package runner_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/boxcar-run/boxcar/internal/job"
)

// TestRejectedMessageStatusSaysWhy (issue 12): a message published without submit that the
// worker rejects gets a status a user can look up, under the id its subject names or its JSON
// id or, when both are unusable or taken, under its stream sequence (stream-seq-N, the sequence the publisher's ack
// reports), and the status's error says what to fix.
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
		{name: "uppercase subject id", subjectID: "PLAIN-000002", body: body("plain-000002"), under: "plain-000002", want: []string{`"PLAIN-000002"`, `"plain-000002"`, "must be equal"}},
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
