//go:build integration

package runner_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/boxcar-run/boxcar/internal/agent"
	"github.com/boxcar-run/boxcar/internal/job"
	"github.com/boxcar-run/boxcar/internal/runner"
	"github.com/boxcar-run/boxcar/internal/sandbox/sandboxtest"
	"github.com/boxcar-run/boxcar/internal/store"
)

// TestInputNotItsSizeFailsAtTheFirstAttempt copies inputs that are not what the job says into
// a real bubblewrap sandbox: each is input_digest_mismatch at the first attempt, a fault of the
// job that no redelivery mends. An object longer than its declared size was retried until the
// job was dead: the sandbox stops at the declared size and reads one byte more to see the end,
// and its own "holds more than its N bytes" hid the mismatch the checked reader had found.
func TestInputNotItsSizeFailsAtTheFirstAttempt(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name   string
		change func(in *job.Input)
	}{
		{name: "declared a byte short", change: func(in *job.Input) { in.Size-- }},
		{name: "declared empty", change: func(in *job.Input) { in.Size = 0 }},
		{name: "declared a byte long", change: func(in *job.Input) { in.Size++ }},
		{name: "changed under its key", change: nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			b.worker(agentFunc(func(context.Context, agent.Request) (agent.Result, error) {
				t.Errorf("the agent ran on an input that is not what the job says")
				return agent.Result{}, nil
			}), func(c *runner.Config) { c.Sandboxes = sandboxtest.Bubblewrap(t) })
			in := b.putInput([]byte("a,b\n1,2\n"))
			if tt.change != nil {
				tt.change(&in)
			} else if err := b.store.Put(context.Background(), store.InputKey(in.SHA256), strings.NewReader("a,b\n1,3\n"), in.Size); err != nil {
				t.Fatal(err)
			}
			j := job.Job{Version: job.Version, ID: job.NewID(), Profile: "p", Task: "t", SubmittedAt: time.Now().UTC(), Inputs: []job.Input{in}}
			b.publish(j)
			st := b.waitFinal(j.ID, time.Minute)
			if st.State != job.StateFailed || st.Attempt != 1 {
				t.Fatalf("status %s at attempt %d (%s), want failed at attempt 1", st.State, st.Attempt, st.Error)
			}
			if m := b.manifest(j.ID).Predicate; m.Outcome.Reason != "input_digest_mismatch" {
				t.Errorf("manifest reason %q (%s), want input_digest_mismatch", m.Outcome.Reason, m.Outcome.Error)
			}
		})
	}
}
