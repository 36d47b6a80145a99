package runner_test

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"path"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/boxcar-run/boxcar/internal/agent"
	"github.com/boxcar-run/boxcar/internal/config"
	"github.com/boxcar-run/boxcar/internal/job"
	"github.com/boxcar-run/boxcar/internal/queue"
	"github.com/boxcar-run/boxcar/internal/runner"
	"github.com/boxcar-run/boxcar/internal/store"
	testharness "github.com/boxcar-run/boxcar/test/harness"
)

// TestEndsBeforeTheAgentGoThroughTheArbiter (issue 10): a delivery that ends a job before its
// agent runs (an unknown profile, an input gone from the store or changed) ends it through the
// run's create-only manifest, as every other end does. The case where that matters: the
// delivery before it, paused just before its commit past the ack deadline, resumes after the
// job was ended, and must not commit a second end. Each case ends with one manifest, one dead
// letter and a status that agree.
func TestEndsBeforeTheAgentGoThroughTheArbiter(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name   string
		state  job.State
		reason string
		// before runs once the first attempt has its inputs, before the second delivery.
		before func(b *bundle, j job.Job)
		second func(c *runner.Config)
	}{
		{name: "unknown profile", state: job.StateRejected, reason: "unknown_profile", second: func(c *runner.Config) {
			// A worker of the fleet whose config lacks the profile (a rollout half done).
			c.Worker.Profiles = map[string]config.Profile{"other": c.Worker.Profiles["p"]}
		}},
		{name: "input gone", state: job.StateFailed, reason: "input_missing", before: func(b *bundle, j job.Job) {
			if err := b.store.Delete(context.Background(), store.InputKey(j.Inputs[0].SHA256)); err != nil {
				b.t.Fatal(err)
			}
		}},
		{name: "input changed", state: job.StateFailed, reason: "input_digest_mismatch", before: func(b *bundle, j job.Job) {
			if err := b.store.Put(context.Background(), store.InputKey(j.Inputs[0].SHA256), strings.NewReader("changed\n"), -1); err != nil {
				b.t.Fatal(err)
			}
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			ctx := context.Background()
			js, err := jetstream.New(b.nc)
			if err != nil {
				t.Fatal(err)
			}
			ended := func() bool { // the second delivery terminated the job
				s, err := js.Stream(ctx, queue.DeadLetterStream(b.cfg.NATS, job.DefaultTenant))
				if err != nil {
					return false
				}
				info, err := s.Info(ctx)
				return err == nil && info.State.Msgs > 0
			}
			var paused sync.Once
			pausing := &hookStore{Store: b.shared}
			pausing.put = func(key string) error {
				if path.Base(key) == "manifest.json" {
					paused.Do(func() { waitFor(t, 30*time.Second, "the second delivery to end the job", ended) })
				}
				return nil
			}
			// No heartbeats: the paused attempt's ack deadline passes while it waits.
			stale := b.worker(agentFunc(writeReport), func(c *runner.Config) {
				c.Store, c.HeartbeatInterval, c.Worker.Concurrency = pausing, time.Hour, 1
			})
			j := b.submit("p")
			waitFor(t, 10*time.Second, "the first attempt's upload", func() bool {
				st, err := b.q.Status(ctx, j.ID)
				return err == nil && st.Progress == "uploading"
			})
			if tt.before != nil {
				tt.before(b, j)
			}
			opts := []func(*runner.Config){}
			if tt.second != nil {
				opts = append(opts, tt.second)
			}
			b.worker(agentFunc(func(context.Context, agent.Request) (agent.Result, error) {
				t.Errorf("the second delivery ran the agent")
				return agent.Result{}, nil
			}), opts...)
			waitFor(t, 30*time.Second, "the second delivery to end the job", ended)
			waitFor(t, 30*time.Second, "the first attempt to end", func() bool { return !stale.r.Holds(j.ID) })

			st := b.waitFinal(j.ID, 30*time.Second)
			m := b.manifest(j.ID).Predicate
			if m.Outcome.State != tt.state || m.Outcome.Reason != tt.reason {
				t.Errorf("manifest records %s (%s), want %s (%s): the job ended twice", m.Outcome.State, m.Outcome.Reason, tt.state, tt.reason)
			}
			if st.State != tt.state || st.Attempt != m.Attempt {
				t.Errorf("status %s on attempt %d, manifest %s on attempt %d; want them to agree on %s", st.State, st.Attempt, m.Outcome.State, m.Attempt, tt.state)
			}
			if n := testutil.ToFloat64(stale.m.StaleAttempts); n != 1 {
				t.Errorf("the first attempt counted %v stale attempts, want 1: it lost the arbiter", n)
			}
			dls := b.deadLetters()
			if len(dls) != 1 || dls[0].Reason != tt.reason {
				t.Errorf("dead letters %+v, want one with reason %s", dls, tt.reason)
			}
		})
	}
}

// statusHookQueue calls after once a status is written in state.
type statusHookQueue struct {
	runner.Queue
	state job.State
	once  sync.Once
	after func()
}

func (q *statusHookQueue) UpdateStatus(ctx context.Context, r queue.Ref, change func(*job.Status), conds ...queue.StatusCond) (job.Status, error) {
	st, err := q.Queue.UpdateStatus(ctx, r, change, conds...)
	if err == nil && st.State == q.state {
		q.once.Do(q.after)
	}
	return st, err
}

// TestDeadLettersCountedOncePerLetter: a job ends (the model refused the key; a message whose
// subject names no valid job id is rejected) and its status says so; NATS then goes away for
// longer than the settling's CleanupTimeout, so the dead letter or the term of that delivery
// does not go through, and the job is delivered again once NATS is back, which terms it. The
// dead-letter stream holds one letter; boxcar_dead_letters_total and boxcar_jobs_total count
// it at most once (a count at each term decided counted two), and exactly once while NATS
// answers. Through an outage a letter whose publish landed but whose answer was lost is
// counted when that delivery reads it back (TestDeadLetterWhoseAnswerWasLostCounted), but a
// delivery that stops trying first leaves it to one that did not write it and counts none.
func TestDeadLettersCountedOncePerLetter(t *testing.T) {
	t.Parallel()
	refuse := agentFunc(func(ctx context.Context, req agent.Request) (agent.Result, error) {
		return agent.Result{}, fmt.Errorf("%w: HTTP 401 invalid key", agent.ErrModelAuth)
	})
	tests := []struct {
		name    string
		state   job.State
		profile string // the label boxcar_jobs_total counts the end under
		// publish sends the job and returns the id its dead letter names.
		publish func(b *bundle) string
		// outage: NATS goes away once the status says state; without, each count is exactly 1.
		outage bool
	}{
		{name: "a failed job", state: job.StateFailed, profile: "p", publish: submitP},
		{name: "a failed job through an outage", state: job.StateFailed, profile: "p", outage: true, publish: submitP},
		{name: "a message with no valid job id", state: job.StateRejected, profile: "unknown", publish: publishNoID},
		{name: "a message with no valid job id through an outage", state: job.StateRejected, profile: "unknown", outage: true, publish: publishNoID},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			var log testharness.LogBuffer
			down, back := make(chan int, 1), make(chan struct{})
			outage := func() {
				port := b.srv.Addr().(*net.TCPAddr).Port
				b.srv.Shutdown()
				b.srv.WaitForShutdown()
				down <- port
			}
			if !tt.outage {
				outage = func() { close(back) }
			}
			w := b.worker(refuse, func(c *runner.Config) {
				c.Queue = &statusHookQueue{Queue: c.Queue, state: tt.state, after: outage}
				c.Logger = slog.New(slog.NewTextHandler(&log, nil))
			})
			id := tt.publish(b)
			select {
			case port := <-down:
				// NATS comes back once a call of the settling (its letter or its term, within
				// CleanupTimeout) failed: the worker gave up on it, or waits for NATS to end the
				// job.
				waitFor(t, time.Minute, "a call of the settling to fail", func() bool {
					return strings.Contains(log.String(), "settle with the queue failed") || strings.Contains(log.String(), "waiting for NATS")
				})
				b.start(port)
			case <-back:
			case <-time.After(testharness.Timeout(time.Minute)):
				t.Fatalf("no status was written %s", tt.state)
			}
			b.checkLetterCounted(w, id, tt.state, tt.profile, tt.outage)
		})
	}
}

func submitP(b *bundle) string { return b.submit("p").ID }

// publishNoID publishes a message on a subject that names no valid job id (uppercase).
func publishNoID(b *bundle) string {
	js, err := jetstream.New(b.nc)
	if err != nil {
		b.t.Fatal(err)
	}
	if _, err := js.Publish(context.Background(), b.cfg.NATS.Subject+".default.NOT-AN-ID", []byte("profile=p")); err != nil {
		b.t.Fatal(err)
	}
	return "NOT-AN-ID"
}

// checkLetterCounted checks that id has one dead letter, counted once in
// boxcar_dead_letters_total under its reason and once in boxcar_jobs_total as state; at most
// once when outage.
func (b *bundle) checkLetterCounted(w *worker, id string, state job.State, profile string, outage bool) {
	t := b.t
	t.Helper()
	letters := func() (reasons []string) {
		for _, dl := range b.deadLetters() {
			if dl.JobID == id {
				reasons = append(reasons, dl.Reason)
			}
		}
		return reasons
	}
	testharness.Wait(t, "the job's dead letter", func() (bool, error) { return len(letters()) > 0, nil },
		testharness.Within(90*time.Second))
	// A later delivery that finds the letter would count again: once the consumer holds no
	// message of the job (the last delivery acked or termed it), none can come, and the stop
	// waits for the last one's counts.
	waitFor(t, 90*time.Second, "the job's message settled", b.consumed)
	w.stop()
	reasons := letters()
	if len(reasons) != 1 {
		t.Fatalf("the dead-letter stream holds %d letters of the job, want 1", len(reasons))
	}
	counts := map[string]float64{
		fmt.Sprintf("boxcar_dead_letters_total{reason=%q}", reasons[0]):                 testutil.ToFloat64(w.m.DeadLetters.WithLabelValues(reasons[0])),
		fmt.Sprintf("boxcar_jobs_total{profile=%q,outcome=%q}", profile, string(state)): testutil.ToFloat64(w.m.Jobs.WithLabelValues(profile, string(state))),
	}
	for name, got := range counts {
		if got > 1 || (got < 1 && !outage) {
			t.Errorf("%s = %v for one letter, want 1", name, got)
		}
	}
	if got := testutil.CollectAndCount(w.m.DeadLetters); got > 1 {
		t.Errorf("boxcar_dead_letters_total has %d series, want the letter's reason %q only", got, reasons[0])
	}
}
