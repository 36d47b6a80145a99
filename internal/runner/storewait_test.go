package runner_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"regexp"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/boxcar-run/boxcar/internal/agent"
	"github.com/boxcar-run/boxcar/internal/job"
	"github.com/boxcar-run/boxcar/internal/runner"
	"github.com/boxcar-run/boxcar/internal/store"
	testharness "github.com/boxcar-run/boxcar/test/harness"
)

// TestStoreWaitFetchesNoJob: while an attempt waits for the store (an outage, or the store
// refusing the worker itself), the worker fetches no job into a slot that frees meanwhile, as
// it fetches none while an attempt waits for the sandbox backend: a job fetched then could
// only wait too, while a worker the store answers could run it. It says so once, and once when
// the store answers again; then the job left in the queue runs at its first delivery. A wait
// for a tenant's own bucket holds no job back: the other jobs need not wait for it.
func TestStoreWaitFetchesNoJob(t *testing.T) {
	t.Parallel()
	outage := errors.New("store unavailable: connection refused")
	for _, tc := range []struct {
		name      string
		err       error
		ownBucket bool // the waiting job's store is its tenant's own bucket
	}{
		{"outage", outage, false},
		{"refuses the worker", fmt.Errorf("store: stat: api error SignatureDoesNotMatch: %w", store.ErrWorkerRefused), false},
		{"outage of a tenant's own bucket", outage, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			storeWaitFetchesNoJob(t, tc.err, tc.ownBucket)
		})
	}
}

func storeWaitFetchesNoJob(t *testing.T, fault error, ownBucket bool) {
	b := setup(t)
	b.cfg.Concurrency = 2
	var waiting atomic.Value // the id of the job whose store calls fail
	waiting.Store("")
	var stats atomic.Int64 // failed calls of the waiting job
	faulty := &hookStore{Store: b.shared, stat: func(key string) error {
		if id := waiting.Load().(string); id != "" && strings.Contains(key, id) {
			stats.Add(1)
			return fault
		}
		return nil
	}}
	held, release := make(chan struct{}), make(chan struct{})
	var logs testharness.LogBuffer
	w := b.worker(agentFunc(func(ctx context.Context, req agent.Request) (agent.Result, error) {
		if req.Task == "hold" {
			close(held)
			<-release
		}
		return writeReport(ctx, req)
	}), func(c *runner.Config) {
		c.Store, c.Logger = faulty, slog.New(slog.NewJSONHandler(&logs, nil))
		if ownBucket { // the same folder of the same store, as the tenant's own
			c.Store, c.TenantStores = b.shared, map[string]store.Store{job.DefaultTenant: faulty}
		}
	})

	// The first slot runs a job until released, the second a job that waits for the store.
	first := b.submitTask("p", "hold")
	<-held
	stuck := b.newJob("p", "t")
	waiting.Store(stuck.ID)
	b.publish(stuck)
	waitFor(t, time.Minute, "the job to wait for the store", func() bool {
		st, err := b.q.Status(context.Background(), stuck.ID)
		return err == nil && strings.HasPrefix(st.Error, "waiting for the store")
	})
	left := b.submit("p")
	close(release)
	if st := b.waitFinal(first.ID, time.Minute); st.State != job.StateSucceeded {
		t.Fatalf("the first job %s: %s", st.State, st.Error)
	}
	hold := regexp.MustCompile(`store unavailable; fetching no jobs until it answers`)
	if ownBucket {
		if st := b.waitFinal(left.ID, time.Minute); st.State != job.StateSucceeded {
			t.Fatalf("the job left in the queue %s while another waits for its tenant's own bucket, want succeeded: %s", st.State, st.Error)
		}
		if n := logs.Count(hold); n != 0 {
			t.Errorf("the worker logged %q while a job waited for its tenant's own bucket", hold)
		}
		waiting.Store("")
		if st := b.waitFinal(stuck.ID, time.Minute); st.State != job.StateSucceeded {
			t.Errorf("the waiting job %s once its bucket answers: %s", st.State, st.Error)
		}
		return
	}
	// Its slot is free; the waiting job tries the store twice more meanwhile.
	tried := stats.Load()
	waitFor(t, time.Minute, "two more tries of the store", func() bool { return stats.Load() >= tried+2 })
	// A job no worker took reads queued, with no attempt.
	if st, err := b.q.Status(context.Background(), left.ID); err != nil || st.State != job.StateQueued || st.Attempt != 0 {
		t.Fatalf("the job left in the queue is %s at attempt %d (%v) while another waits for the store, want queued: it was fetched", st.State, st.Attempt, err)
	}
	if n := testutil.ToFloat64(w.m.JobsInFlight); n != 1 {
		t.Fatalf("%v jobs in flight while one waits for the store, want 1: the free slot fetched a job", n)
	}
	if n := logs.Count(hold); n != 1 {
		t.Errorf("the worker logged %q %d times, want once", hold, n)
	}

	waiting.Store("")
	for _, id := range []string{stuck.ID, left.ID} {
		if st := b.waitFinal(id, time.Minute); st.State != job.StateSucceeded || st.Attempt != 1 {
			t.Errorf("job %s: %s at attempt %d once the store answers, want succeeded at 1: %s", id, st.State, st.Attempt, st.Error)
		}
	}
	if !regexp.MustCompile(`"msg":"store answers; fetching jobs again","waited_ms":\d+`).MatchString(logs.String()) {
		t.Errorf("the worker did not log that the store answers again, with waited_ms:\n%s", logs.String())
	}
}
