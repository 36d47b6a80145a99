//go:build integration

package runner_test

import (
	"context"
	"log/slog"
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
