package runner_test

import (
	"context"
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
	"github.com/boxcar-run/boxcar/internal/runner"
	"github.com/boxcar-run/boxcar/internal/store"
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
				s, err := js.Stream(ctx, b.cfg.NATS.DeadLetterStream)
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
