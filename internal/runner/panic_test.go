package runner_test

import (
	"io"
	"log/slog"
	"path"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/boxcar-run/boxcar/internal/job"
	"github.com/boxcar-run/boxcar/internal/runner"
	"github.com/boxcar-run/boxcar/test/harness"
)

// TestStagePanicFailsItsJobAndTheWorkerGoesOn: a panic in a stage of an attempt other than
// the agent's run (the claim's look at the store, the sandbox's start, the inputs' copy, the
// artifacts' upload, the manifest's commit) ends that job failed with the reason
// worker_panicked, once, counted as its dead letter, with fixed words for the tenant and the
// stack in the worker's log under the job's id and tenant; its sandbox is closed, and the
// worker lives on and runs the next job. A panic met on every worker the job is delivered to
// would otherwise take the fleet down one worker at a time.
func TestStagePanicFailsItsJobAndTheWorkerGoesOn(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		// arm makes the worker's config panic once, at the stage, calling hit when it does.
		arm func(b *bundle, c *runner.Config, hit func())
	}{
		{name: "claim", arm: func(b *bundle, c *runner.Config, hit func()) {
			c.Store = &hookStore{Store: b.shared, stat: func(key string) error {
				if path.Base(key) == "manifest.json" {
					hit()
				}
				return nil
			}}
		}},
		{name: "sandbox start", arm: func(_ *bundle, c *runner.Config, hit func()) {
			c.Sandboxes.(*fakeProvider).starts = hit
		}},
		{name: "inputs copy", arm: func(_ *bundle, c *runner.Config, hit func()) {
			c.Sandboxes.(*fakeProvider).writes = func(string) { hit() }
		}},
		{name: "artifacts upload", arm: func(_ *bundle, c *runner.Config, hit func()) {
			c.Sandboxes.(*fakeProvider).reads = func(name string, data []byte) io.Reader {
				if strings.HasSuffix(name, "table.csv") {
					hit()
				}
				return strings.NewReader(string(data))
			}
		}},
		{name: "commit", arm: func(b *bundle, c *runner.Config, hit func()) {
			c.Store = &hookStore{Store: b.shared, put: func(key string) error {
				if path.Base(key) == "manifest.json" {
					hit()
				}
				return nil
			}}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			var logs harness.LogBuffer
			var panics atomic.Int64
			hit := func() {
				if panics.Add(1) == 1 {
					panic("a nil map in the " + tc.name)
				}
			}
			w := b.worker(agentFunc(writeReport), func(c *runner.Config) {
				c.Logger = slog.New(slog.NewJSONHandler(&logs, nil))
				tc.arm(b, c, hit)
			})
			bad := b.submit("p")
			st := b.waitFinal(bad.ID, 10*time.Second)
			if st.State != job.StateFailed || !strings.HasPrefix(st.Error, "the worker panicked on the job") || strings.Contains(st.Error, "nil map") {
				t.Fatalf("status = %+v, want failed in the fixed words of a worker's panic", st)
			}
			if out := b.manifest(bad.ID).Predicate.Outcome; out.Reason != "worker_panicked" {
				t.Errorf("manifest outcome = %+v, want the reason worker_panicked", out)
			}
			const msg = "the worker panicked on the job; the job fails and the worker goes on"
			for key, want := range map[string]string{"job_id": bad.ID, "tenant": "default", "panic": tc.name, "stack": "panic_test.go"} {
				if got, _ := logs.Record(msg, key); !strings.Contains(got, want) {
					t.Errorf("log %q: %s = %.200q, want it to hold %q\n%s", msg, key, got, want, logs.String())
				}
			}
			waitFor(t, 5*time.Second, "the dead letter counted", func() bool {
				return testutil.ToFloat64(w.m.DeadLetters.WithLabelValues("worker_panicked")) == 1
			})
			good := b.submit("p")
			if st := b.waitFinal(good.ID, 10*time.Second); st.State != job.StateSucceeded {
				t.Errorf("the next job's status = %+v, want succeeded by the same worker", st)
			}
			if n := panics.Load(); n < 1 {
				t.Errorf("the %s never panicked", tc.name)
			}
			if n := w.p.open.Load(); n != 0 {
				t.Errorf("%d sandboxes left open, want every one closed", n)
			}
		})
	}
}

// TestSettlePanicLeavesItsJobAndTheWorkerGoesOn: a panic while an attempt settles (here once
// the status says succeeded, before the ack) is logged with the job's id and tenant; the worker
// lives on and runs the next job, and the job's next delivery, after the ack wait, adopts its
// committed run.
func TestSettlePanicLeavesItsJobAndTheWorkerGoesOn(t *testing.T) {
	t.Parallel()
	b := setup(t)
	var logs harness.LogBuffer
	b.worker(agentFunc(writeReport), func(c *runner.Config) {
		c.Logger = slog.New(slog.NewJSONHandler(&logs, nil))
		c.Queue = &statusHookQueue{Queue: c.Queue, state: job.StateSucceeded, after: func() { panic("a nil map in the settling") }}
	})
	bad := b.submit("p")
	const msg = "the worker panicked settling the job; it is left to its next delivery"
	waitFor(t, 10*time.Second, "the panic logged", func() bool { _, ok := logs.Record(msg, "job_id"); return ok })
	for key, want := range map[string]string{"job_id": bad.ID, "tenant": "default", "stack": "panic_test.go"} {
		if got, _ := logs.Record(msg, key); !strings.Contains(got, want) {
			t.Errorf("log %q: %s = %.200q, want it to hold %q\n%s", msg, key, got, want, logs.String())
		}
	}
	good := b.submit("p")
	if st := b.waitFinal(good.ID, 10*time.Second); st.State != job.StateSucceeded {
		t.Errorf("the next job's status = %+v, want succeeded by the same worker", st)
	}
	waitFor(t, 20*time.Second, "the job's next delivery to acknowledge it", b.consumed)
	if st := b.waitFinal(bad.ID, time.Second); st.State != job.StateSucceeded {
		t.Errorf("status = %+v, want succeeded as its manifest says", st)
	}
}
