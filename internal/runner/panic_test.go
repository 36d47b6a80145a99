package runner_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/netip"
	"path"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/boxcar-run/boxcar/internal/agent"
	"github.com/boxcar-run/boxcar/internal/egress"
	"github.com/boxcar-run/boxcar/internal/job"
	"github.com/boxcar-run/boxcar/internal/queue"
	"github.com/boxcar-run/boxcar/internal/runner"
	"github.com/boxcar-run/boxcar/internal/sandbox"
	"github.com/boxcar-run/boxcar/internal/store"
	"github.com/boxcar-run/boxcar/test/harness"
)

// TestStagePanicFailsItsJobAndTheWorkerGoesOn: a panic in a stage of an attempt other than
// the agent's run (the claim's look at the store, the sandbox's start, the inputs' copy, the
// artifacts' upload, the manifest's commit), or in a goroutine the attempt started beside its
// stages (a progress write while the inputs are copied or the run uploaded, the delivery's
// heartbeats), ends that job failed with the reason worker_panicked, once, counted as its dead
// letter, with fixed words for the tenant and the stack in the worker's log under the job's id
// and tenant; its sandbox is closed, and the worker lives on and runs the next job. A panic met
// on every worker the job is delivered to would otherwise take the fleet down one worker at a
// time. (A goroutine's panic ended the test's process on main: a stage's recover never sees
// another goroutine's panic.)
func TestStagePanicFailsItsJobAndTheWorkerGoesOn(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		// arm makes the worker's config panic once, at the stage (pw.hit). A panic in a
		// goroutine beside a stage holds that stage until the panic stopped the attempt
		// (pw.hold), or the stage would end first and the job succeed.
		arm func(b *bundle, c *runner.Config, pw *panicWatch)
	}{
		{name: "claim", arm: func(b *bundle, c *runner.Config, pw *panicWatch) {
			c.Store = &hookStore{Store: b.shared, stat: func(key string) error {
				if path.Base(key) == "manifest.json" {
					pw.hit()
				}
				return nil
			}}
		}},
		{name: "sandbox start", arm: func(_ *bundle, c *runner.Config, pw *panicWatch) {
			c.Sandboxes.(*fakeProvider).starts = pw.hit
		}},
		{name: "inputs copy", arm: func(_ *bundle, c *runner.Config, pw *panicWatch) {
			c.Sandboxes.(*fakeProvider).writes = func(context.Context, string) { pw.hit() }
		}},
		{name: "artifacts upload", arm: func(_ *bundle, c *runner.Config, pw *panicWatch) {
			c.Sandboxes.(*fakeProvider).reads = func(_ context.Context, name string, data []byte) io.Reader {
				if strings.HasSuffix(name, "table.csv") {
					pw.hit()
				}
				return strings.NewReader(string(data))
			}
		}},
		{name: "commit", arm: func(b *bundle, c *runner.Config, pw *panicWatch) {
			c.Store = &hookStore{Store: b.shared, put: func(key string) error {
				if path.Base(key) == "manifest.json" {
					pw.hit()
				}
				return nil
			}}
		}},
		{name: "progress write of the inputs' copy", arm: func(_ *bundle, c *runner.Config, pw *panicWatch) {
			c.Queue = &writeHookQueue{Queue: c.Queue, write: func(s job.Status) {
				if s.Progress == "copying inputs" {
					pw.hit()
				}
			}}
			c.Sandboxes.(*fakeProvider).writes = func(ctx context.Context, _ string) { pw.hold(ctx) }
		}},
		{name: "progress write of the upload", arm: func(_ *bundle, c *runner.Config, pw *panicWatch) {
			c.Queue = &writeHookQueue{Queue: c.Queue, write: func(s job.Status) {
				if s.Progress == "uploading" {
					pw.hit()
				}
			}}
			c.Sandboxes.(*fakeProvider).reads = func(ctx context.Context, _ string, data []byte) io.Reader {
				pw.hold(ctx)
				return strings.NewReader(string(data))
			}
		}},
		{name: "heartbeats", arm: func(_ *bundle, c *runner.Config, pw *panicWatch) {
			runner.HeartbeatWith(c, func(d *queue.Delivery, ctx context.Context, interval time.Duration) {
				pw.hit()
				d.Heartbeat(ctx, interval)
			})
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			pw := newPanicWatch(tc.name)
			w := b.worker(agentFunc(writeReport), func(c *runner.Config) {
				c.Logger = pw.logger()
				tc.arm(b, c, pw)
			})
			pw.check(t, b, w, b.submit("p").ID)
			if n := w.p.open.Load(); n != 0 {
				t.Errorf("%d sandboxes left open, want every one closed", n)
			}
		})
	}
}

// panicWatch panics once where a test arms it and keeps the worker's log.
type panicWatch struct {
	what   string
	logs   harness.LogBuffer
	panics atomic.Int64
}

func newPanicWatch(what string) *panicWatch { return &panicWatch{what: what} }

const panicMessage = "the worker panicked on the job; the job fails and the worker goes on"

// logger is the worker's: JSON records into pw.logs.
func (pw *panicWatch) logger() *slog.Logger { return slog.New(slog.NewJSONHandler(&pw.logs, nil)) }

// hit panics the first time it is called.
func (pw *panicWatch) hit() {
	if pw.panics.Add(1) == 1 {
		panic("a nil map in the " + pw.what)
	}
}

// hold waits, until the panic has come, for the end of ctx, a context of the attempt that
// the panic stops; a later job is not held.
func (pw *panicWatch) hold(ctx context.Context) {
	if pw.panics.Load() == 0 {
		<-ctx.Done()
	}
}

// check holds the job id to its end as the worker's panic (worker_panicked, fixed words, the
// stack in the log under its id and tenant, one dead letter counted) and the worker to the
// next job, which succeeds.
func (pw *panicWatch) check(t *testing.T, b *bundle, w *worker, id string) {
	t.Helper()
	st := b.waitFinal(id, 10*time.Second)
	if st.State != job.StateFailed || !strings.HasPrefix(st.Error, "the worker panicked on the job") || strings.Contains(st.Error, "nil map") {
		t.Fatalf("status = %+v, want failed in the fixed words of a worker's panic", st)
	}
	if out := b.manifest(id).Predicate.Outcome; out.Reason != "worker_panicked" {
		t.Errorf("manifest outcome = %+v, want the reason worker_panicked", out)
	}
	// The line follows the attempt's stop in the goroutine that panicked, which nothing of
	// the job's end waits for: as good as always in the log by now, but not by any order.
	waitFor(t, 10*time.Second, "the panic logged", func() bool { _, ok := pw.logs.Record(panicMessage, "job_id"); return ok })
	for key, want := range map[string]string{"job_id": id, "tenant": "default", "panic": pw.what, "stack": "_test.go"} {
		if got, _ := pw.logs.Record(panicMessage, key); !strings.Contains(got, want) {
			t.Errorf("log %q: %s = %.200q, want it to hold %q\n%s", panicMessage, key, got, want, pw.logs.String())
		}
	}
	waitFor(t, 5*time.Second, "the dead letter counted", func() bool {
		return testutil.ToFloat64(w.m.DeadLetters.WithLabelValues("worker_panicked")) == 1
	})
	good := b.submit(b.manifest(id).Predicate.Job.Profile)
	if st := b.waitFinal(good.ID, 10*time.Second); st.State != job.StateSucceeded {
		t.Errorf("the next job's status = %+v, want succeeded by the same worker", st)
	}
	if n := pw.panics.Load(); n < 1 {
		t.Errorf("the %s never panicked", pw.what)
	}
}

// writeHookQueue calls write with what each status write sets on an empty status, before
// the write, and status before each read of a status.
type writeHookQueue struct {
	runner.Queue
	write  func(job.Status)
	status func(queue.Ref)
}

func (q *writeHookQueue) UpdateStatus(ctx context.Context, r queue.Ref, change func(*job.Status), conds ...queue.StatusCond) (job.Status, error) {
	if q.write != nil {
		var s job.Status
		change(&s)
		q.write(s)
	}
	return q.Queue.UpdateStatus(ctx, r, change, conds...)
}

func (q *writeHookQueue) Status(ctx context.Context, r queue.Ref) (job.Status, error) {
	if q.status != nil {
		q.status(r)
	}
	return q.Queue.Status(ctx, r)
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

// TestEgressPanicFailsItsJobAndTheWorkerGoesOn: a panic in the job's egress proxy, in its
// accept loop (the sandbox's listener) or in a connection's goroutine (the name's look-up),
// ends the job as the worker's panic, as one in a stage does, and the worker goes on: the
// proxy's goroutines are the job's (egress.Config.Go), not the worker's. The agent goes on
// after its failed request until its context ends, as the real one's next model call does.
func TestEgressPanicFailsItsJobAndTheWorkerGoesOn(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		arm  func(c *runner.Config, p *listenerProvider, hit func())
	}{
		{name: "egress proxy's accept", arm: func(_ *runner.Config, p *listenerProvider, hit func()) {
			p.accept = hit
		}},
		{name: "egress proxy's connection", arm: func(c *runner.Config, _ *listenerProvider, hit func()) {
			c.Egress.Resolver = panicResolver{Resolver: c.Egress.Resolver, hit: hit}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			up := egressUpstream(t, func(string) {})
			b := egressSetup(t)
			pw := newPanicWatch(tc.name)
			p := &listenerProvider{}
			w := b.worker(agentFunc(func(ctx context.Context, req agent.Request) (agent.Result, error) {
				res, err := req.Sandbox.Exec(ctx, sandbox.ExecRequest{Argv: []string{"https://api.boxcar.test/v1"}})
				if err != nil || string(res.Stdout) != "answer" {
					<-ctx.Done()
					return agent.Result{}, fmt.Errorf("the request through the proxy: %q, %v", res.Stderr, err)
				}
				return writeReport(ctx, req)
			}), func(c *runner.Config) {
				c.Sandboxes = p
				c.Logger = pw.logger()
				c.LookupEnv = func(k string) (string, bool) { return "real-api-token-0123456789abcdef", k == "BOXCAR_TEST_API_TOKEN" }
				c.Egress = up
				tc.arm(c, p, pw.hit)
			})
			pw.check(t, b, w, b.submit("net").ID)
			if open, all := p.open(); open != 0 || all == 0 {
				t.Errorf("%d of the %d egress listeners attached are open", open, all)
			}
		})
	}
}

// panicResolver calls hit before each look-up.
type panicResolver struct {
	egress.Resolver
	hit func()
}

func (r panicResolver) LookupNetIP(ctx context.Context, network, host string) ([]netip.Addr, error) {
	r.hit()
	return r.Resolver.LookupNetIP(ctx, network, host)
}

// TestCancelWatchPanicSparesTheWorker: a panic in the cancel watch's handling of a request
// (here the status read of the job it cancels) is logged with the job's id and tenant, the
// job's attempt here ends, and the watch goes on: the next job's cancel is carried out, and
// the worker runs jobs. The watch is the worker's, and a panic in it ended the process.
func TestCancelWatchPanicSparesTheWorker(t *testing.T) {
	t.Parallel()
	b := setup(t)
	pw := newPanicWatch("cancel watch")
	running := make(chan string, 2)
	b.worker(agentFunc(func(ctx context.Context, req agent.Request) (agent.Result, error) {
		if req.Task == "hold" {
			running <- req.JobID
			<-ctx.Done()
			return agent.Result{}, context.Cause(ctx)
		}
		return writeReport(ctx, req)
	}), func(c *runner.Config) {
		c.Logger = pw.logger()
		c.Queue = &writeHookQueue{Queue: c.Queue, status: func(queue.Ref) { pw.hit() }}
	})
	for i := range 2 {
		j := b.submitTask("p", "hold")
		if id := <-running; id != j.ID {
			t.Fatalf("job %s runs, want %s", id, j.ID)
		}
		if _, err := b.q.Cancel(context.Background(), j.ID, "tester"); err != nil {
			t.Fatal(err)
		}
		if st := b.waitFinal(j.ID, 10*time.Second); !st.State.Terminal() || st.State == job.StateSucceeded {
			t.Fatalf("cancelled job %d: status %+v, want it ended", i, st)
		}
		if i == 0 {
			for key, want := range map[string]string{"job_id": j.ID, "tenant": "default", "stack": "panic_test.go"} {
				if got, _ := pw.logs.Record(panicMessage, key); !strings.Contains(got, want) {
					t.Errorf("log %q: %s = %.200q, want it to hold %q\n%s", panicMessage, key, got, want, pw.logs.String())
				}
			}
		}
	}
	if st := b.waitFinal(b.submit("p").ID, 10*time.Second); st.State != job.StateSucceeded {
		t.Errorf("the next job's status = %+v, want succeeded by the same worker", st)
	}
}

// TestRecurringEndPanicIsDeadLettered: the commit of a job's end panics on every delivery (the
// manifest's put, both the run's and the end's). Each delivery but the last leaves the end to
// the next, as a panic of one worker's state may pass; the last ends the job failed, reason
// worker_panicked, one dead letter, the stream empty, no manifest (none could be written), and
// the worker goes on. It was delivered again after every delivery, for ever: a job past its
// max_deliver that is exhausted commits its end too, and panicked there again.
func TestRecurringEndPanicIsDeadLettered(t *testing.T) {
	t.Parallel()
	b := setup(t)
	var bad atomic.Value
	bad.Store("")
	pw := newPanicWatch("commit")
	w := b.worker(agentFunc(writeReport), func(c *runner.Config) {
		c.Logger = pw.logger()
		c.Store = &hookStore{Store: b.shared, put: func(key string) error {
			if path.Base(key) == "manifest.json" && path.Base(path.Dir(key)) == bad.Load() {
				pw.panics.Add(1)
				panic("a nil map in the commit")
			}
			return nil
		}}
	})
	j := b.newJob("p", "t")
	bad.Store(j.ID)
	b.publish(j)
	st := b.waitFinal(j.ID, 30*time.Second)
	if st.State != job.StateFailed || !strings.HasPrefix(st.Error, "the worker panicked recording the job's end") || st.Attempt != b.cfg.NATS.MaxDeliver {
		t.Fatalf("status = %+v, want failed in the fixed words of a worker's panic at its last delivery, %d", st, b.cfg.NATS.MaxDeliver)
	}
	waitFor(t, 10*time.Second, "the job's message settled", b.consumed)
	var letters []queue.DeadLetter
	for _, dl := range b.deadLetters() {
		if dl.JobID == j.ID {
			letters = append(letters, dl)
		}
	}
	if len(letters) != 1 || letters[0].Reason != "worker_panicked" {
		t.Errorf("dead letters %+v, want one, reason worker_panicked", letters)
	}
	if _, err := b.store.Stat(context.Background(), store.ManifestKey(j.ID)); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("manifest: %v, want none", err)
	}
	if got, _ := pw.logs.Record(panicMessage, "stage"); got == "" {
		t.Errorf("no panic logged:\n%s", pw.logs.String())
	}
	waitFor(t, 5*time.Second, "the dead letter counted", func() bool {
		return testutil.ToFloat64(w.m.DeadLetters.WithLabelValues("worker_panicked")) == 1
	})
	if st := b.waitFinal(b.submit("p").ID, 10*time.Second); st.State != job.StateSucceeded {
		t.Errorf("the next job's status = %+v, want succeeded by the same worker", st)
	}
}
