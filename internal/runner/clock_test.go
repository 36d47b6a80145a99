package runner_test

import (
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"

	"github.com/boxcar-run/boxcar/internal/job"
	"github.com/boxcar-run/boxcar/internal/runner"
)

// TestQueueWaitWithAWorkerClockBehindTheServers: a job's queue wait is its start, on the
// worker's clock, less its message's time, on the NATS server's. A worker whose clock is 5
// minutes behind the server's must not record a negative wait: boxcar_queue_wait_seconds' sum
// would fall, which rate() reads as a counter reset, and its lowest bucket count jobs that
// waited minutes.
func TestQueueWaitWithAWorkerClockBehindTheServers(t *testing.T) {
	t.Parallel()
	b := setup(t)
	w := b.worker(agentFunc(writeReport), func(c *runner.Config) {
		c.Now = func() time.Time { return time.Now().Add(-5 * time.Minute) }
	})
	j := b.submitTask("p", "t")
	if st := b.waitFinal(j.ID, 30*time.Second); st.State != job.StateSucceeded {
		t.Fatalf("the job ended %s (%s), want succeeded", st.State, st.Error)
	}
	var m dto.Metric
	if err := w.m.QueueWait.WithLabelValues("p").(interface{ Write(*dto.Metric) error }).Write(&m); err != nil {
		t.Fatal(err)
	}
	h := m.GetHistogram()
	if h.GetSampleCount() != 1 || h.GetSampleSum() < 0 {
		t.Errorf("boxcar_queue_wait_seconds: %d samples, sum %gs; want one, not negative", h.GetSampleCount(), h.GetSampleSum())
	}
}

// TestAttemptBoundsOnTheProcesssClock: a worker whose wall clock (Config.Now) is a day off
// still runs a job to the end: the attempt's deadline and every duration (its phases, its
// heartbeats' bound, its commit's) are measured on the process's clock, while its records (the
// status's and manifest's start, the queue wait) take the wall clock. A deadline set on the
// wall clock and waited for on the process's ended every wait of a worker behind at once.
func TestAttemptBoundsOnTheProcesssClock(t *testing.T) {
	t.Parallel()
	for _, skew := range []time.Duration{-24 * time.Hour, 24 * time.Hour} {
		t.Run(skew.String(), func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			b.worker(agentFunc(writeReport), func(c *runner.Config) {
				c.Now = func() time.Time { return time.Now().Add(skew) }
			})
			j := b.submitTask("p", "t")
			if st := b.waitFinal(j.ID, 30*time.Second); st.State != job.StateSucceeded {
				t.Fatalf("the job ended %s (%s), want succeeded", st.State, st.Error)
			}
			m := b.manifest(j.ID).Predicate
			if m.Usage == nil {
				t.Fatal("the manifest has no usage")
			}
			for phase, ms := range m.Usage.PhasesMS {
				if ms < 0 || ms >= time.Hour.Milliseconds() {
					t.Errorf("phase %s took %dms by the manifest; the worker's clock is %s off, and the job ran seconds", phase, ms, skew)
				}
			}
			if d := m.Timings.FinishedAt.Sub(m.Timings.StartedAt); d < 0 || d >= time.Hour {
				t.Errorf("the manifest's start and finish are %s apart; want both on the worker's clock", d)
			}
		})
	}
}
