package runner_test

import (
	"context"
	"encoding/json"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/boxcar-run/boxcar/internal/agent"
	"github.com/boxcar-run/boxcar/internal/job"
)

// TestOldSubmitsMessageIDRunsAJobOnce: a submit from before 781bbc5 sets Nats-Msg-Id to
// "<tenant>.<id>" on the job's own subject; current ones set none. Through a rollout that mixes
// them, one job id submitted twice, by either in either order, at once (a retry) or after the
// first run committed, runs once: the header can only make the server drop a publish, and a
// later message of a committed job is ended with that run, not run again.
func TestOldSubmitsMessageIDRunsAJobOnce(t *testing.T) {
	t.Parallel()
	const oldHeader, noHeader = true, false
	tests := []struct {
		name          string
		first, second bool // whether each publish carries the old submit's header
		afterCommit   bool // the second is published once the first run committed
	}{
		{name: "old submit retried at once", first: oldHeader, second: oldHeader},
		{name: "old, then new once committed", first: oldHeader, second: noHeader, afterCommit: true},
		{name: "new, then old once committed", first: noHeader, second: oldHeader, afterCommit: true},
		{name: "old, then old once committed", first: oldHeader, second: oldHeader, afterCommit: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			var runs atomic.Int32
			b.worker(agentFunc(func(ctx context.Context, req agent.Request) (agent.Result, error) {
				runs.Add(1)
				return writeReport(ctx, req)
			}))
			j := b.newJob("p", "t")
			b.publishAs(j, tt.first)
			if tt.afterCommit {
				if st := b.waitFinal(j.ID, time.Minute); st.State != job.StateSucceeded {
					t.Fatalf("first run: %s: %s", st.State, st.Error)
				}
				waitFor(t, time.Minute, "the first message acked", b.consumed)
			}
			// Stored, the second message is delivered: the worker finds the run committed.
			if stored := b.publishAs(j, tt.second); tt.afterCommit && tt.second == noHeader && !stored {
				t.Fatal("the second publish, with no header, of a job whose message was acked was not stored")
			}
			if st := b.waitFinal(j.ID, time.Minute); st.State != job.StateSucceeded {
				t.Fatalf("%s: %s", st.State, st.Error)
			}
			waitFor(t, time.Minute, "every message of the job settled", b.consumed)
			if n := runs.Load(); n != 1 {
				t.Errorf("the agent ran the job %d times, want once", n)
			}
		})
	}
}

// publishAs publishes j on its subject, with the Nats-Msg-Id a submit before 781bbc5 set when
// old, and reports whether the stream stored it; a publish the server drops as a duplicate or
// refuses (the job's subject holds a message already) is no error here.
func (b *bundle) publishAs(j job.Job, old bool) (stored bool) {
	b.t.Helper()
	data, err := json.Marshal(j)
	if err != nil {
		b.t.Fatal(err)
	}
	js, err := jetstream.New(b.nc)
	if err != nil {
		b.t.Fatal(err)
	}
	var opts []jetstream.PublishOpt
	if old {
		opts = append(opts, jetstream.WithMsgID(job.DefaultTenant+"."+j.ID))
	}
	ack, err := js.PublishMsg(context.Background(), &nats.Msg{Subject: b.cfg.NATS.Subject + "." + job.DefaultTenant + "." + j.ID, Data: data}, opts...)
	var api *jetstream.APIError
	if err != nil && !errors.As(err, &api) {
		b.t.Fatalf("publish: %v", err)
	}
	return err == nil && !ack.Duplicate
}
