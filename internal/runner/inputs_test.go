package runner_test

import (
	"bytes"
	"context"
	"math"
	"testing"
	"time"

	"github.com/boxcar-run/boxcar/internal/agent"
	"github.com/boxcar-run/boxcar/internal/config"
	"github.com/boxcar-run/boxcar/internal/job"
	"github.com/boxcar-run/boxcar/internal/runner"
)

// TestInputTooLargeFailsAtTheFirstAttempt (issue 27): an input the profile cannot take, over
// its max_input_bytes or, by default, over its workdir, is a permanent fault of the job: it
// fails at the first attempt as input_too_large, before any sandbox starts, and spends no
// further delivery. It used to be retried as transient until the job was dead. Sizes whose
// sum passes int64 count as too large too: they wrapped below zero, passed max_input_bytes, and
// the sandbox started and took the inputs before them, however large.
func TestInputTooLargeFailsAtTheFirstAttempt(t *testing.T) {
	t.Parallel()
	maxInput := func(p *config.Profile) { p.Limits.MaxInputBytes = 1024 }
	tests := []struct {
		name    string
		profile func(p *config.Profile)
		inputs  func(b *bundle) []job.Input
	}{
		{name: "over max_input_bytes", profile: maxInput, inputs: sized(2048)},
		{name: "over the workdir", inputs: sized(4096), profile: func(p *config.Profile) {
			p.Sandbox.Disk = "2Ki"
			p.Limits.MaxInputBytes = 0
			*p = p.WithDefaults()
		}},
		{name: "sizes summing past int64", profile: maxInput, inputs: func(b *bundle) []job.Input {
			small := sized(10)(b)[0]
			huge := small
			huge.Name, huge.Size = "huge.bin", math.MaxInt64-5
			return []job.Input{small, huge}
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			p := b.cfg.Profiles["p"]
			tt.profile(&p)
			b.cfg.Profiles = map[string]config.Profile{"p": p}
			w := b.worker(agentFunc(func(context.Context, agent.Request) (agent.Result, error) {
				t.Errorf("the agent ran for an input the profile cannot take")
				return agent.Result{}, nil
			}), func(c *runner.Config) { c.Worker.Concurrency = 1 })
			j := job.Job{Version: job.Version, ID: job.NewID(), Profile: "p", Task: "t", SubmittedAt: time.Now().UTC(),
				Inputs: tt.inputs(b)}
			b.publish(j)
			st := b.waitFinal(j.ID, 30*time.Second)
			if st.State != job.StateFailed || st.Attempt != 1 {
				t.Fatalf("status %s at attempt %d (%s), want failed at attempt 1", st.State, st.Attempt, st.Error)
			}
			if m := b.manifest(j.ID).Predicate; m.Outcome.Reason != "input_too_large" {
				t.Errorf("manifest reason %q (%s), want input_too_large", m.Outcome.Reason, m.Outcome.Error)
			}
			// The status is settled before the delivery is: wait for the dead letter.
			waitFor(t, 30*time.Second, "the job's dead letter", func() bool { return len(b.deadLetters()) > 0 })
			if dls := b.deadLetters(); len(dls) != 1 || dls[0].Reason != "input_too_large" {
				t.Errorf("dead letters %+v, want one with reason input_too_large", dls)
			}
			if n := w.p.started.Load(); n != 0 {
				t.Errorf("%d sandboxes started; the limit is checked before any starts", n)
			}
		})
	}
}

// sized is one stored input of size bytes.
func sized(size int) func(b *bundle) []job.Input {
	return func(b *bundle) []job.Input { return []job.Input{b.putInput(bytes.Repeat([]byte("x"), size))} }
}
