package runner_test

import (
	"context"
	"log/slog"
	"strings"
	"sync/atomic"
	"time"

	"github.com/boxcar-run/boxcar/internal/agent"
	"github.com/boxcar-run/boxcar/internal/job"
	"github.com/boxcar-run/boxcar/internal/queue"
	"github.com/boxcar-run/boxcar/internal/runner"
	"github.com/boxcar-run/boxcar/test/harness"
)

// counted is how a job ended on runCounted's worker.
type counted struct {
	st      job.Status
	letters []queue.DeadLetter // once every message is settled
	runs    int64              // of the agent
	logs    *harness.LogBuffer // the worker's, JSON
}

// runCounted publishes j to a new worker whose agent counts its runs and writes the report,
// logging JSON to a buffer (opts go after that), and returns how the job ended.
func (b *bundle) runCounted(j job.Job, opts ...func(*runner.Config)) counted {
	b.t.Helper()
	var runs atomic.Int64
	logs := &harness.LogBuffer{}
	logged := func(c *runner.Config) { c.Logger = slog.New(slog.NewJSONHandler(logs, nil)) }
	b.worker(agentFunc(func(ctx context.Context, req agent.Request) (agent.Result, error) {
		runs.Add(1)
		return writeReport(ctx, req)
	}), append([]func(*runner.Config){logged}, opts...)...)
	b.publish(j)
	c := counted{st: b.waitFinal(j.ID, 2*time.Minute), logs: logs}
	c.letters, c.runs = b.settledLetters(), runs.Load()
	b.t.Logf("final status: state %s attempt %d error %q; the agent ran %d times", c.st.State, c.st.Attempt, c.st.Error, c.runs)
	return c
}

// waitsForTheStore publishes j to a new worker and holds that its attempt waits for the store
// with its delivery, as for an outage, while what refuses the worker lasts (while says what),
// and that the job succeeds at its first attempt once lift has lifted it.
func (b *bundle) waitsForTheStore(j job.Job, while string, lift func()) {
	b.t.Helper()
	b.worker(agentFunc(writeReport))
	b.publish(j)
	var st job.Status
	waitFor(b.t, time.Minute, "the status to say the attempt waits for the store", func() bool {
		var err error
		st, err = b.q.Status(context.Background(), j.ID)
		return err == nil && strings.HasPrefix(st.Error, "waiting for the store") || st.State.Terminal()
	})
	if st.State.Terminal() {
		b.t.Fatalf("job ended %s (%q) while %s; want it waiting", st.State, st.Error, while)
	}
	lift()
	if st = b.waitFinal(j.ID, 2*time.Minute); st.State != job.StateSucceeded || st.Attempt != 1 {
		b.t.Errorf("job ended %s at attempt %d (%q), want succeeded at the first once that is lifted (%s)", st.State, st.Attempt, st.Error, while)
	}
}
