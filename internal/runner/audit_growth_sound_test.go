package runner_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/boxcar-run/boxcar/internal/agent"
	"github.com/boxcar-run/boxcar/internal/job"
)

// openFDs counts the process's open file descriptors.
func openFDs(t *testing.T) int {
	t.Helper()
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Skip("no /proc/self/fd")
	}
	return len(ents)
}

// settledGoroutines waits for the goroutine count to stop falling and returns it.
func settledGoroutines() int {
	n := runtime.NumGoroutine()
	for range 40 {
		time.Sleep(50 * time.Millisecond)
		m := runtime.NumGoroutine()
		if m >= n {
			return m
		}
		n = m
	}
	return n
}

// TestAuditGrowthManyJobsReturnToBaseline: one worker runs batch after batch of jobs ending every
// way the runner knows: succeeded, failed (agent panic), cancelled mid-run, waiting for an
// approval nobody gives, and failing as the agent's model refuses. Once each batch ended and
// the worker is idle, its goroutines and open fds must be where they were after the first
// batch: nothing a job leaves may stay for the worker's life.
func TestAuditSoundGrowthManyJobsReturnToBaseline(t *testing.T) {
	b := setup(t)
	ctx := context.Background()
	running := make(chan string, 64)
	w := b.worker(agentFunc(func(ctx context.Context, req agent.Request) (agent.Result, error) {
		switch {
		case strings.HasPrefix(req.Task, "panic"):
			panic("boom")
		case strings.HasPrefix(req.Task, "hang"):
			running <- req.JobID
			<-ctx.Done()
			return agent.Result{}, ctx.Err()
		case strings.HasPrefix(req.Task, "ask"):
			actx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
			defer cancel()
			_, err := req.Approver.Approve(actx, agent.ApprovalRequest{JobID: req.JobID, CallID: "call_1", Argv: []string{"make"}})
			if err != nil && !errors.Is(err, context.DeadlineExceeded) {
				return agent.Result{}, err
			}
			return writeReport(ctx, req)
		case strings.HasPrefix(req.Task, "reject"):
			return agent.Result{}, fmt.Errorf("%w: 400 bad request", agent.ErrModelRequest)
		}
		return writeReport(ctx, req)
	}), withApprovals)

	batch := func(round int) {
		var ids []string
		for i := range 3 {
			for _, kind := range []string{"ok", "panic", "ask", "reject"} {
				ids = append(ids, b.submitTask("p", fmt.Sprintf("%s-%d-%d", kind, round, i)).ID)
			}
			h := b.submitTask("p", fmt.Sprintf("hang-%d-%d", round, i))
			<-running
			if _, err := b.q.Cancel(ctx, h.ID, "tester"); err != nil {
				t.Fatal(err)
			}
			ids = append(ids, h.ID)
		}
		for _, id := range ids {
			b.waitFinal(id, 30*time.Second)
		}
		waitFor(t, 20*time.Second, "the consumer to be drained", b.consumed)
	}
	batch(0)
	batch(1)
	g0, f0 := settledGoroutines(), openFDs(t)
	for round := 2; round < 6; round++ {
		batch(round)
	}
	g1, f1 := settledGoroutines(), openFDs(t)
	t.Logf("goroutines %d -> %d, fds %d -> %d (60 jobs between)", g0, g1, f0, f1)
	if g1 > g0+5 {
		buf := make([]byte, 1<<20)
		n := runtime.Stack(buf, true)
		t.Errorf("goroutines grew from %d to %d over 60 jobs; the worker leaks per job\n%s", g0, g1, buf[:n])
	}
	if f1 > f0+5 {
		t.Errorf("open fds grew from %d to %d over 60 jobs", f0, f1)
	}
	w.stop()
	_ = job.StateSucceeded
}
