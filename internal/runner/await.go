package runner

import (
	"context"
	"errors"
	"time"

	"github.com/boxcar-run/boxcar/internal/backoff"
	"github.com/boxcar-run/boxcar/internal/job"
	"github.com/boxcar-run/boxcar/internal/queue"
	"github.com/boxcar-run/boxcar/internal/store"
)

// awaitAnswer runs call until the dependency it talks to (the store, NATS) answers, which
// answered tells from call's error, and returns call's last result. An outage is not the
// job's fault: handing the delivery back would spend one of its max_deliver deliveries (before
// the attempt did any work) or throw the work away (while it commits), so the attempt waits
// instead, while its in-progress acks keep the delivery. The wait ends when ctx ends (a
// shutdown hands the job back at once) or at the attempt's deadline, then it is retried as
// any transient fault is. A wait is logged when it begins and ends.
//
// Every wait of an attempt gives up at the same deadline (attempt.deadline: started plus twice
// job_timeout), however many there are, so an attempt holds its slot at most twice its
// job_timeout: the waits before the job starts give up job_timeout earlier, so that the run
// keeps its whole job_timeout, and the waits after it share what is left.
func awaitAnswer[T any](ctx context.Context, r *Runner, a *attempt, what string, answered func(error) bool, call func(context.Context) (T, error)) (T, error) {
	return awaitUntil(ctx, r, a, a.startBy(), what, "before the job can start", answered, call)
}

// awaitAnswerTo is awaitAnswer for a wait that the log describes as before something else
// (before the run can be committed), after the run: it gives up at the attempt's deadline.
func awaitAnswerTo[T any](ctx context.Context, r *Runner, a *attempt, what, before string, answered func(error) bool, call func(context.Context) (T, error)) (T, error) {
	return awaitUntil(ctx, r, a, a.deadline, what, before, answered, call)
}

// startBy is when the waits before the run give up: the latest start that leaves the run its
// whole job_timeout before the attempt's deadline.
func (a *attempt) startBy() time.Time {
	return a.deadline.Add(-time.Duration(a.limits.JobTimeout))
}

func awaitUntil[T any](ctx context.Context, r *Runner, a *attempt, giveUp time.Time, what, before string, answered func(error) bool, call func(context.Context) (T, error)) (T, error) {
	var began time.Time
	// While it waits, the fetch loop takes no job if the dependency is one of fetchHolds.
	holding := r.waitersOf(a, what)
	defer func() {
		if holding != nil && !began.IsZero() {
			holding.leave()
		}
	}()
	for round := 1; ; round++ {
		v, err := call(ctx)
		if answered(err) {
			if !began.IsZero() {
				a.log.InfoContext(ctx, what+" answers; the job goes on", "waited_ms", time.Since(began).Milliseconds())
			}
			return v, err
		}
		if ctx.Err() != nil || !time.Now().Before(giveUp) {
			return v, err
		}
		if began.IsZero() {
			began = time.Now()
			a.log.WarnContext(ctx, "waiting for "+what+" "+before+"; the delivery is kept", "error", err, "give_up_after", time.Until(giveUp).Round(time.Millisecond).String())
			if holding != nil {
				holding.enter()
			}
			r.noteWait(ctx, a, what)
		}
		select {
		case <-ctx.Done():
			return v, err
		case <-time.After(min(backoff.Delay(round), time.Until(giveUp))):
		}
	}
}

// storeAnswered: the store answered, found or not, or refused the tenant's writes (the job
// fails: "store refuses the tenant's writes"). A store whose server no longer refuses a
// second create-only put (store.ErrUnsafeServer) is waited for like one that is down: no
// attempt could commit on it.
func storeAnswered(err error) bool {
	return err == nil || errors.Is(err, store.ErrNotFound) || errors.Is(err, store.ErrWriteRefused)
}

// storeSafe: the store did not refuse for want of a server that refuses overwrites.
func storeSafe(err error) bool { return !errors.Is(err, store.ErrUnsafeServer) }

// statusAnswered: the status bucket answered a read, found or not.
func statusAnswered(err error) bool { return err == nil || errors.Is(err, queue.ErrUnknownJob) }

// natsAnswered: the status bucket took the write, or refused it: the job already ended, or
// the write's conditions failed (a later delivery holds the job, a status exists).
func natsAnswered(err error) bool {
	return err == nil || errors.Is(err, queue.ErrFinal) || errors.Is(err, queue.ErrSuperseded) || errors.Is(err, queue.ErrStatusExists)
}

// noteWait says in the job's status what it waits for, when NATS takes the write: `submit
// status` then shows why a job is not running yet, in fixed words (waitWords), never the
// dependency's (its address, a store's paths, the cluster's namespace); the log line of the
// wait has the whole error, with the job's id and tenant.
func (r *Runner) noteWait(ctx context.Context, a *attempt, what string) {
	wctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	_, _ = r.writeStatus(wctx, a, a.job.ID, func(s *job.Status) {
		s.Error = "waiting for " + what + waitWords
		if s.State == "" {
			s.State = job.StateQueued // the first status of the job: submit writes none
		}
	})
}
