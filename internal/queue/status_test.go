package queue_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"reflect"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/boxcar-run/boxcar/internal/job"
	"github.com/boxcar-run/boxcar/internal/queue"
	"github.com/boxcar-run/boxcar/test/harness"
)

// A worker's handle skips the read before its own next write of a job's status; a write by
// anyone else in between (a cancel request, a second worker, a final outcome) must still be
// seen, never overwritten.
func TestStatusWritesByOthersAreNeverLost(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	other, err := queue.NewConsumer(ctx, b.nc, b.cfg, nil, slog.New(slog.DiscardHandler), nil)
	if err != nil {
		t.Fatal(err)
	}
	j := b.submit(t)
	update := func(q *queue.Consumer, change func(*job.Status)) job.Status {
		t.Helper()
		st, err := q.UpdateStatus(ctx, ref(j.ID), change)
		if err != nil {
			t.Fatal(err)
		}
		return st
	}
	update(b.w, func(s *job.Status) { s.State, s.Progress = job.StateRunning, "starting" })
	update(b.w, func(s *job.Status) { s.Progress = "turn 1" }) // from what this handle wrote
	update(other, func(s *job.Status) { s.CancelRequested = true })
	st := update(b.w, func(s *job.Status) { s.ToolCalls = 3 })
	if !st.CancelRequested || st.Progress != "turn 1" || st.ToolCalls != 3 {
		t.Fatalf("after a write by another handle: %+v; want the cancel request, progress and tool calls kept", st)
	}
	if got, err := b.c.Status(ctx, j.ID); err != nil || !reflect.DeepEqual(got, st) {
		t.Fatalf("stored %+v (%v), want %+v", got, err, st)
	}

	update(other, func(s *job.Status) { s.State = job.StateCancelled })
	if _, err := b.w.UpdateStatus(ctx, ref(j.ID), func(s *job.Status) { s.State = job.StateSucceeded }); !errors.Is(err, queue.ErrFinal) {
		t.Fatalf("update after another handle ended the job: %v, want ErrFinal", err)
	}
	if got, _ := b.c.Status(ctx, j.ID); got.State != job.StateCancelled {
		t.Fatalf("state %s, want cancelled kept", got.State)
	}
}

// A status bucket that answers nobody for a while (its replicas electing a leader after a node
// of a cluster went down; here the bucket's stream is gone until the write has tried it) does
// not lose a job's status: the write waits and lands once the bucket answers again.
func TestStatusWriteWaitsOutABucketWithNoLeader(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	j := b.submit(t)
	if _, err := b.w.UpdateStatus(ctx, ref(j.ID), func(s *job.Status) { s.State = job.StateRunning }); err != nil {
		t.Fatal(err)
	}
	bucket, err := b.js.Stream(ctx, "KV_"+queue.StatusBucket(b.cfg, tenant))
	if err != nil {
		t.Fatal(err)
	}
	sc := bucket.CachedInfo().Config
	if err := b.js.DeleteStream(ctx, sc.Name); err != nil {
		t.Fatal(err)
	}
	sent := b.nc.Stats().OutMsgs
	done := make(chan error, 1)
	go func() {
		_, err := b.w.UpdateStatus(ctx, ref(j.ID), func(s *job.Status) { s.State = job.StateSucceeded })
		done <- err
	}()
	// The write (nats.go tries a publish that nobody answers three times) and a read after it
	// met nobody.
	for b.nc.Stats().OutMsgs < sent+4 {
		select {
		case err := <-done:
			t.Fatalf("the write ended while the bucket answered nobody: %v; want it to wait", err)
		case <-time.After(10 * time.Millisecond):
		}
	}
	if _, err := b.js.CreateStream(ctx, sc); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatalf("the write after the bucket came back: %v", err)
	}
	if st, err := b.c.Status(ctx, j.ID); err != nil || st.State != job.StateSucceeded {
		t.Fatalf("status %+v (%v), want succeeded", st, err)
	}
}

// TestUpdateNewStatus: a first delivery's claim creates the status in one write; where a
// status exists after all, the change applies to it, never over it.
func TestUpdateNewStatus(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	running := func(s *job.Status) { s.State, s.Attempt, s.Progress = job.StateRunning, 1, "starting" }
	tests := []struct {
		name    string
		before  func(s *job.Status) // written first by another handle (mine: by the same); nil: no status
		mine    bool
		want    func(t *testing.T, st job.Status, err error)
		oneSend bool
	}{
		{name: "written by this handle while the job waited", mine: true, oneSend: true,
			before: func(s *job.Status) { s.State, s.Error = job.StateQueued, "waiting for the store: down" },
			want: func(t *testing.T, st job.Status, err error) {
				if err != nil || st.State != job.StateRunning || st.Error != "waiting for the store: down" {
					t.Errorf("= %+v, %v; want it running, the earlier write kept", st, err)
				}
			}},
		{name: "no status yet", oneSend: true, want: func(t *testing.T, st job.Status, err error) {
			if err != nil || st.State != job.StateRunning || st.Progress != "starting" {
				t.Errorf("= %+v, %v; want it running", st, err)
			}
		}},
		{name: "a cancel asked while it waited", before: func(s *job.Status) { s.State, s.CancelRequested = job.StateQueued, true },
			want: func(t *testing.T, st job.Status, err error) {
				if err != nil || st.State != job.StateRunning || !st.CancelRequested {
					t.Errorf("= %+v, %v; want it running with the cancel request kept", st, err)
				}
			}},
		{name: "ended while it waited", before: func(s *job.Status) { s.State = job.StateCancelled },
			want: func(t *testing.T, st job.Status, err error) {
				if !errors.Is(err, queue.ErrFinal) || st.State != job.StateCancelled {
					t.Errorf("= %+v, %v; want ErrFinal and the end kept", st, err)
				}
			}},
	}
	other, err := queue.NewConsumer(ctx, b.nc, b.cfg, nil, slog.New(slog.DiscardHandler), nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			j := b.submit(t)
			if tt.before != nil {
				by := other
				if tt.mine {
					by = b.w
				}
				if _, err := by.UpdateStatus(ctx, ref(j.ID), tt.before); err != nil {
					t.Fatal(err)
				}
			}
			sent := b.nc.Stats().OutMsgs
			st, err := b.w.UpdateNewStatus(ctx, ref(j.ID), running)
			if n := b.nc.Stats().OutMsgs - sent; tt.oneSend && n != 1 {
				t.Errorf("sent %d messages, want 1: the create alone", n)
			}
			tt.want(t, st, err)
			if err == nil {
				if got, _ := b.c.Status(ctx, j.ID); !reflect.DeepEqual(got, st) {
					t.Errorf("stored %+v, want %+v", got, st)
				}
			}
		})
	}
}

// TestStatusConditions: a write held to ByAttempt never changes the status a later delivery
// wrote, and one held to OnlyNew never changes a status that exists, whoever's handle wrote it
// last (a cached guess must not slip past the check); a refused write changes nothing.
func TestStatusConditions(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	attempt := func(n int) func(*job.Status) {
		return func(s *job.Status) { s.State, s.Attempt = job.StateRunning, n }
	}
	retrying := func(s *job.Status) { s.State, s.Error = job.StateRetrying, "model: connection reset" }
	tests := []struct {
		name   string
		before func(*job.Status) // nil: no status
		cond   queue.StatusCond
		want   error // nil: written
	}{
		{name: "attempt 1 after attempt 2 began", before: attempt(2), cond: queue.ByAttempt(1), want: queue.ErrSuperseded},
		{name: "attempt 2 over its own", before: attempt(2), cond: queue.ByAttempt(2)},
		{name: "attempt 2 after attempt 1", before: attempt(1), cond: queue.ByAttempt(2)},
		{name: "a delivery with no status yet", cond: queue.ByAttempt(1)},
		{name: "only new, none there", cond: queue.OnlyNew},
		{name: "only new over a status", before: attempt(1), cond: queue.OnlyNew, want: queue.ErrStatusExists},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			j := b.submit(t)
			if tt.before != nil {
				// By the same handle: its cached guess is what it would try first.
				if _, err := b.w.UpdateStatus(ctx, ref(j.ID), tt.before); err != nil {
					t.Fatal(err)
				}
			}
			before, _ := b.c.Status(ctx, j.ID)
			st, err := b.w.UpdateStatus(ctx, ref(j.ID), retrying, tt.cond)
			after, _ := b.c.Status(ctx, j.ID)
			switch {
			case tt.want == nil && (err != nil || after.State != job.StateRetrying):
				t.Errorf("= %+v, %v; stored %+v; want it written", st, err, after)
			case tt.want != nil && (!errors.Is(err, tt.want) || !reflect.DeepEqual(after, before)):
				t.Errorf("= %v; stored %+v, before %+v; want %v and nothing changed", err, after, before, tt.want)
			}
		})
	}
}

// TestWatchEndsForAnUnknownJob: a watch of a job id that has no status and that the job stream
// does not hold (never submitted, or as another tenant) ends, its channel closed with nothing
// sent, once the job has stayed unknown for queue.UnknownGrace; it polled until its context
// ended. A job published within the grace is said queued (the watch asked the stream once and
// never again, so a watch begun just before the publish saw nothing until a worker's status).
func TestWatchEndsForAnUnknownJob(t *testing.T) {
	t.Parallel()
	b := setup(t)
	start := time.Now()
	updates := b.watch(t, newJob(t).ID, queue.UnknownGrace+30*time.Second)
	for st := range updates {
		t.Fatalf("watch of a job never submitted sent %+v", st)
	}
	if took := time.Since(start); took < queue.UnknownGrace || took > queue.UnknownGrace+10*time.Second {
		t.Errorf("the watch of a job never submitted ended after %s; want just past the grace, %s", took, queue.UnknownGrace)
	}

	// Within the grace, a job being published as the watch starts: the watch has looked for it
	// in the job stream, found nothing, and looks again.
	late := newJob(t)
	looked := harness.Requested(t, b.nc, "$JS.API.STREAM.INFO."+queue.JobStream(b.cfg, tenant), late.ID, 2)
	updates = b.watch(t, late.ID, queue.UnknownGrace+30*time.Second)
	looked()
	if _, err := b.c.Publish(t.Context(), late); err != nil {
		t.Fatal(err)
	}
	if st, ok := <-updates; !ok || st.State != job.StateQueued {
		t.Fatalf("watch of a job published within the grace: %+v, %v; want queued", st, ok)
	}
}

// TestWatchEndsForAJobThatLeftTheStream: a job the watch saw queued that then leaves the job
// stream with no status (an operator purged it, or the stream's limits removed it) is unknown
// like one never submitted: the watch ends, nothing more sent, once it has stayed so for
// queue.UnknownGrace. The watch looked the job up in the stream once, saw it queued, and then
// waited for a worker's status until its timeout.
func TestWatchEndsForAJobThatLeftTheStream(t *testing.T) {
	t.Parallel()
	b := setup(t)
	j := b.submit(t)
	updates := b.watch(t, j.ID, queue.UnknownGrace+30*time.Second)
	if st, ok := <-updates; !ok || st.State != job.StateQueued {
		t.Fatalf("watch of a published job: %+v, %v; want queued", st, ok)
	}
	stream, err := b.js.Stream(t.Context(), queue.JobStream(b.cfg, tenant))
	if err != nil {
		t.Fatal(err)
	}
	purged := time.Now()
	if err := stream.Purge(t.Context(), jetstream.WithPurgeSubject(b.cfg.Subject+"."+tenant+"."+j.ID)); err != nil {
		t.Fatal(err)
	}
	for st := range updates {
		t.Fatalf("watch of a purged job sent %+v; want it to end with nothing more", st)
	}
	if took := time.Since(purged); took < queue.UnknownGrace || took > queue.UnknownGrace+10*time.Second {
		t.Errorf("the watch of a purged job ended %s after the purge; want just past the grace, %s", took, queue.UnknownGrace)
	}
}

// TestWatchFollowsAClaimedJobWithoutStatus: a job a worker has fetched but not yet written a
// status for stays in the job stream (the stream keeps a message until its ack, and the
// claim writes the status before any ack), so its watch never says it unknown, however long
// the claim takes, and follows the worker's first status.
func TestWatchFollowsAClaimedJobWithoutStatus(t *testing.T) {
	t.Parallel()
	b := setup(t)
	j := b.submit(t)
	d := fetch(t, b.w, 5*time.Second)
	defer d.KeepAlive(t.Context(), 0)()
	updates := b.watch(t, j.ID, queue.UnknownGrace+30*time.Second)
	if st, ok := <-updates; !ok || st.State != job.StateQueued {
		t.Fatalf("watch of a fetched job: %+v, %v; want queued", st, ok)
	}
	select {
	case st, ok := <-updates:
		t.Fatalf("watch of a fetched job without a status: %+v, %v; want it still waiting", st, ok)
	case <-time.After(queue.UnknownGrace + 2*time.Second):
	}
	if _, err := b.w.UpdateNewStatus(t.Context(), ref(j.ID), func(s *job.Status) { s.State = job.StateRunning }); err != nil {
		t.Fatal(err)
	}
	if st, ok := <-updates; !ok || st.State != job.StateRunning {
		t.Fatalf("watch of a claimed job: %+v, %v; want running", st, ok)
	}
}

// TestStatusWritesShareNoMaps: the status a handle wrote last, which its next write starts
// from, shares no map with what a write returned or with another write of the same job under
// way: a worker's cancel watch and the job's attempt write its status at once (a cancel while
// it waits for approval), each change editing the job's asked requests or labels in place. One
// of them marshalled the map the other wrote (a data race, and Go's fatal "concurrent map read
// and map write", the worker gone), and a caller editing a returned status changed what the
// next write stored.
func TestStatusWritesShareNoMaps(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	j := b.submit(t)
	st, err := b.w.UpdateStatus(ctx, ref(j.ID), func(s *job.Status) {
		s.State, s.Labels = job.StateRunning, map[string]string{"team": "a"}
		s.RecordAsked("call_0", job.Asked{Revision: 1})
	})
	if err != nil {
		t.Fatal(err)
	}
	st.Labels["team"], st.Asked["forged"] = "b", job.Asked{Revision: 9} // the caller's copy
	if st, err = b.w.UpdateStatus(ctx, ref(j.ID), func(s *job.Status) { s.Progress = "turn 1" }); err != nil {
		t.Fatal(err)
	}
	if _, forged := st.Asked["forged"]; forged || st.Labels["team"] != "a" {
		t.Errorf("after a caller edited a returned status the next write stored labels %v, asked %v", st.Labels, st.Asked)
	}
	var wg sync.WaitGroup
	for i := range 8 {
		wg.Go(func() {
			_, err := b.w.UpdateStatus(ctx, ref(j.ID), func(s *job.Status) {
				s.RecordAsked(fmt.Sprintf("call_%d", i+1), job.Asked{Revision: uint64(i + 1)})
				s.Labels[fmt.Sprint("writer", i)] = "x"
			})
			if err != nil {
				t.Error(err)
			}
		})
	}
	wg.Wait()
	if got, err := b.c.Status(ctx, j.ID); err != nil || len(got.Asked) != 9 || len(got.Labels) != 9 {
		t.Errorf("after 8 writes at once: asked %v, labels %v (%v); want each write's", got.Asked, got.Labels, err)
	}
}
