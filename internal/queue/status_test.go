package queue_test

import (
	"context"
	"errors"
	"reflect"
	"testing"

	"github.com/boxcar-run/boxcar/internal/job"
	"github.com/boxcar-run/boxcar/internal/queue"
)

// A worker's handle skips the read before its own next write of a job's status; a write by
// anyone else in between (a cancel request, a second worker, a final outcome) must still be
// seen, never overwritten.
func TestStatusWritesByOthersAreNeverLost(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	other, err := queue.Bind(ctx, b.nc, b.cfg)
	if err != nil {
		t.Fatal(err)
	}
	j := newJob(t)
	if _, err := b.q.Publish(ctx, j); err != nil {
		t.Fatal(err)
	}
	update := func(q *queue.Queue, change func(*job.Status)) job.Status {
		t.Helper()
		st, err := q.UpdateStatus(ctx, j.ID, change)
		if err != nil {
			t.Fatal(err)
		}
		return st
	}
	update(b.q, func(s *job.Status) { s.State, s.Progress = job.StateRunning, "starting" })
	update(b.q, func(s *job.Status) { s.Progress = "turn 1" }) // from what this handle wrote
	update(other, func(s *job.Status) { s.CancelRequested = true })
	st := update(b.q, func(s *job.Status) { s.ToolCalls = 3 })
	if !st.CancelRequested || st.Progress != "turn 1" || st.ToolCalls != 3 {
		t.Fatalf("after a write by another handle: %+v; want the cancel request, progress and tool calls kept", st)
	}
	if got, err := b.q.Status(ctx, j.ID); err != nil || !reflect.DeepEqual(got, st) {
		t.Fatalf("stored %+v (%v), want %+v", got, err, st)
	}

	update(other, func(s *job.Status) { s.State = job.StateCancelled })
	if _, err := b.q.UpdateStatus(ctx, j.ID, func(s *job.Status) { s.State = job.StateSucceeded }); !errors.Is(err, queue.ErrFinal) {
		t.Fatalf("update after another handle ended the job: %v, want ErrFinal", err)
	}
	if got, _ := b.q.Status(ctx, j.ID); got.State != job.StateCancelled {
		t.Fatalf("state %s, want cancelled kept", got.State)
	}
}
