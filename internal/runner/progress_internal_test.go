package runner

import (
	"context"
	"log/slog"
	"sync/atomic"
	"testing"
	"time"

	"github.com/boxcar-run/boxcar/internal/job"
	"github.com/boxcar-run/boxcar/internal/queue"
)

// progressQueue takes an attempt's status writes: write runs for each, with its context.
type progressQueue struct {
	Queue
	write func(ctx context.Context, s job.Status)
}

func (q progressQueue) UpdateStatus(ctx context.Context, _ queue.Ref, change func(*job.Status), _ ...queue.StatusCond) (job.Status, error) {
	var s job.Status
	change(&s)
	q.write(ctx, s)
	return s, ctx.Err()
}

func progressAttempt() *attempt {
	return &attempt{d: &queue.Delivery{Attempt: 1}, job: job.Job{ID: "j1"}, log: slog.New(slog.DiscardHandler),
		cancel: func(error) {}}
}

// TestProgressIfSlow: a step still running after progressDelay has its progress written once;
// a step that ends while the write is in flight stops it (its context ends) and done returns
// only once the write did, so that it never races the attempt's next write.
func TestProgressIfSlow(t *testing.T) {
	t.Parallel()
	t.Run("written once the step is slow", func(t *testing.T) {
		t.Parallel()
		wrote := make(chan string, 2)
		r := &Runner{cfg: Config{Queue: progressQueue{write: func(_ context.Context, s job.Status) { wrote <- s.Progress }}}}
		done := r.progressIfSlow(t.Context(), progressAttempt(), "copying inputs")
		if got := <-wrote; got != "copying inputs" {
			t.Fatalf("progress %q written, want %q", got, "copying inputs")
		}
		done()
		if len(wrote) != 0 {
			t.Fatalf("%d more writes", len(wrote))
		}
	})
	t.Run("a write in flight is stopped and awaited", func(t *testing.T) {
		t.Parallel()
		var returned atomic.Bool
		started := make(chan struct{})
		r := &Runner{cfg: Config{Queue: progressQueue{write: func(ctx context.Context, _ job.Status) {
			close(started)
			<-ctx.Done() // a write NATS does not answer
			returned.Store(true)
		}}}}
		done := r.progressIfSlow(t.Context(), progressAttempt(), "uploading")
		<-started
		done()
		if !returned.Load() {
			t.Fatal("done returned before the write in flight")
		}
	})
	t.Run("none once the attempt ended", func(t *testing.T) {
		t.Parallel()
		ctx, cancel := context.WithCancel(t.Context())
		cancel()
		var writes atomic.Int32
		r := &Runner{cfg: Config{Queue: progressQueue{write: func(context.Context, job.Status) { writes.Add(1) }}}}
		done := r.progressIfSlow(ctx, progressAttempt(), "uploading")
		time.Sleep(2 * progressDelay)
		done()
		if n := writes.Load(); n != 0 {
			t.Fatalf("%d progress writes after the attempt ended", n)
		}
	})
}

// TestProgressIfSlowAllocations: a step that ends before progressDelay (every step of a
// trivial job, two a job) costs its timer and little else: no goroutine, context or channel.
//
//nolint:paralleltest // counts the process's allocations, which a parallel test would add to
func TestProgressIfSlowAllocations(t *testing.T) {
	r := &Runner{cfg: Config{Queue: progressQueue{write: func(context.Context, job.Status) {}}}}
	a, ctx := progressAttempt(), t.Context()
	if n := testing.AllocsPerRun(100, func() { r.progressIfSlow(ctx, a, "uploading")() }); n > 4 {
		t.Fatalf("%v allocations a step, want at most 4", n)
	}
}

func BenchmarkProgressIfSlow(b *testing.B) {
	r := &Runner{cfg: Config{Queue: progressQueue{write: func(context.Context, job.Status) {}}}}
	a, ctx := progressAttempt(), b.Context()
	b.ReportAllocs()
	for b.Loop() {
		r.progressIfSlow(ctx, a, "uploading")()
	}
}
