package runner

import (
	"context"
	"errors"
	"log/slog"
	"testing"
	"time"

	"github.com/boxcar-run/boxcar/internal/config"
	"github.com/boxcar-run/boxcar/internal/job"
	"github.com/boxcar-run/boxcar/internal/queue"
)

// statusQueue is a Queue whose status writes go nowhere: noteWait's target.
type statusQueue struct{}

func (statusQueue) Fetch(context.Context) (*queue.Delivery, error) { return nil, errors.New("none") }
func (statusQueue) Status(context.Context, queue.Ref) (job.Status, error) {
	return job.Status{}, queue.ErrUnknownJob
}
func (statusQueue) UpdateStatus(context.Context, queue.Ref, func(*job.Status), ...queue.StatusCond) (job.Status, error) {
	return job.Status{}, nil
}
func (q statusQueue) UpdateNewStatus(ctx context.Context, r queue.Ref, change func(*job.Status), conds ...queue.StatusCond) (job.Status, error) {
	return q.UpdateStatus(ctx, r, change, conds...)
}
func (statusQueue) Tenants() []string { return nil }
func (statusQueue) WatchCancels(context.Context, string) (<-chan queue.CancelUpdate, error) {
	return nil, errors.New("none")
}
func (statusQueue) WatchAllCancels(context.Context) (<-chan queue.CancelUpdate, error) {
	return nil, errors.New("none")
}
func (statusQueue) CancelAsked(context.Context, queue.Ref) (bool, error) { return false, nil }
func (statusQueue) ReleaseCancel(context.Context, queue.Ref) error       { return nil }
func (statusQueue) Queued(context.Context, queue.Ref) (bool, error)      { return false, nil }
func (statusQueue) LiveProfiles(context.Context) ([]queue.WorkerProfiles, error) {
	return nil, queue.ErrNoProfiles
}

// TestWaitsShareTheAttemptDeadline: an attempt's waits all give up at its one deadline. A
// dependency that never answers makes the first wait last until then; every wait after it
// tries once and gives up, instead of waiting a job_timeout of its own each (which let one
// attempt wait several job timeouts in a row).
func TestWaitsShareTheAttemptDeadline(t *testing.T) {
	t.Parallel()
	r := &Runner{cfg: Config{Queue: statusQueue{}}}
	timeout := 300 * time.Millisecond
	a := &attempt{
		d:       &queue.Delivery{},
		log:     slog.New(slog.DiscardHandler),
		limits:  config.Limits{JobTimeout: config.Duration(timeout)},
		started: time.Now(),
	}
	a.deadline = a.started.Add(2 * timeout)
	down := errors.New("connection refused")
	calls := 0
	call := func(context.Context) (struct{}, error) {
		calls++
		return struct{}{}, down
	}
	never := func(err error) bool { return err == nil }

	// Before the run: the waits give up job_timeout before the deadline, so that the run
	// keeps its whole job_timeout.
	if _, err := awaitAnswer(t.Context(), r, a, "the store", never, call); !errors.Is(err, down) {
		t.Fatalf("first wait = %v, want the dependency's error", err)
	}
	if calls < 2 {
		t.Fatalf("first wait tried %d times; it should have waited until the attempt's start deadline", calls)
	}
	for i, what := range []string{"NATS", "the store", "NATS"} {
		calls = 0
		if _, err := awaitAnswer(t.Context(), r, a, what, never, call); !errors.Is(err, down) {
			t.Fatalf("wait %d = %v, want the dependency's error", i+2, err)
		}
		if calls != 1 {
			t.Errorf("wait %d before the run tried %d times after the start deadline passed; want 1 (no fresh timeout)", i+2, calls)
		}
	}

	// After the run the waits share what is left until the deadline, then try once each.
	calls = 0
	if _, err := awaitAnswerTo(t.Context(), r, a, "the store", "before the run can be committed", never, call); !errors.Is(err, down) {
		t.Fatalf("commit wait = %v, want the dependency's error", err)
	}
	if calls < 2 {
		t.Fatalf("commit wait tried %d times; it should have waited until the attempt's deadline", calls)
	}
	if time.Now().Before(a.deadline) {
		t.Errorf("the commit wait gave up before the attempt's deadline")
	}
	for i := range 3 {
		calls = 0
		_, _ = awaitAnswerTo(t.Context(), r, a, "NATS", "before the job can end", never, call)
		if calls != 1 {
			t.Errorf("wait %d after the deadline tried %d times; want 1", i+1, calls)
		}
	}
}
