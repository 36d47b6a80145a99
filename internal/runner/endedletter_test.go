package runner_test

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/boxcar-run/boxcar/internal/job"
	"github.com/boxcar-run/boxcar/internal/queue"
)

// TestEndedJobKeepsItsDeadLetter: `worker setup` retiring a tenant writes a job's status dead
// (unknown_tenant), then its dead letter, then removes its message. Setup stopped after the
// status (or the dead-letter stream did not answer), a worker of the old config fetched the
// job, found it ended and acked it with no letter: the message gone, the next setup found
// nothing to letter, and the dead job could never be replayed. A delivery that finds its job
// ended in a state with a dead letter, and no run committed, makes sure the letter exists
// before the message goes; one there already stays the job's only one. While the letter cannot
// be written (no dead-letter stream answers), the message is kept, for a later delivery.
func TestEndedJobKeepsItsDeadLetter(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name     string
		lettered bool // setup wrote the letter before it stopped
		down     bool // no dead-letter stream answers the worker's first deliveries
	}{
		{name: "setup stopped before the letter"},
		{name: "setup stopped after the letter", lettered: true},
		{name: "dead-letter streams down", down: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			if tc.down {
				b.cfg.NATS.MaxDeliver = 10 // room for the deliveries a busy machine takes to bring the streams back
			}
			ctx := context.Background()
			j := b.newJob("p", "t")
			_, setupQ := b.connect()
			why := "no worker serves tenant \"default\": add it to tenants: in the worker config"
			if _, err := setupQ.UpdateNewStatus(ctx, queue.Ref{Tenant: job.DefaultTenant, ID: j.ID}, func(s *job.Status) {
				s.ID, s.State, s.Profile = j.ID, job.StateDead, j.Profile
				s.Error, s.FinishedAt = queue.ReasonUnknownTenant+": "+why, time.Now().UTC()
			}); err != nil {
				t.Fatal(err)
			}
			js, err := jetstream.New(b.nc)
			if err != nil {
				t.Fatal(err)
			}
			if tc.lettered {
				data, err := json.Marshal(queue.DeadLetter{Tenant: job.DefaultTenant, JobID: j.ID, Reason: queue.ReasonUnknownTenant, Error: why, At: time.Now().UTC()})
				if err != nil {
					t.Fatal(err)
				}
				subject := queue.DeadLetterStream(b.cfg.NATS, job.DefaultTenant) + "." + j.ID
				if _, err := js.Publish(ctx, subject, data); err != nil {
					t.Fatal(err)
				}
			}
			b.worker(agentFunc(writeReport)) // its start declares the streams
			if tc.down {
				for _, name := range []string{b.cfg.NATS.DeadLetterStream, queue.DeadLetterStream(b.cfg.NATS, job.DefaultTenant)} {
					if err := js.DeleteStream(ctx, name); err != nil {
						t.Fatal(err)
					}
				}
			}
			b.publish(j)
			if tc.down {
				keptThroughOutage(t, b, js)
			}

			var got []queue.DeadLetter
			for _, dl := range b.settledLetters() {
				if dl.JobID == j.ID {
					got = append(got, dl)
				}
			}
			if len(got) != 1 || got[0].Reason != queue.ReasonUnknownTenant || got[0].Error != why {
				t.Errorf("dead letters of job %s: %+v; want one, %s: %q", j.ID, got, queue.ReasonUnknownTenant, why)
			}
			s, err := js.Stream(ctx, queue.JobStream(b.cfg.NATS, job.DefaultTenant))
			if err != nil {
				t.Fatal(err)
			}
			info, err := s.Info(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if info.State.Msgs != 0 {
				t.Errorf("the job stream holds %d messages after the worker settled the job; want it removed", info.State.Msgs)
			}
			if st, err := b.q.Status(ctx, j.ID); err != nil || st.State != job.StateDead {
				t.Errorf("status %+v, %v; want it left dead", st, err)
			}
		})
	}
}

// keptThroughOutage waits for the job's second delivery, which comes only when the first did
// not settle it, sees no letter written and the message kept, and brings the dead-letter
// streams back as `worker setup` does.
func keptThroughOutage(t *testing.T, b *bundle, js jetstream.JetStream) {
	t.Helper()
	ctx := context.Background()
	c, err := js.Consumer(ctx, queue.JobStream(b.cfg.NATS, job.DefaultTenant), b.cfg.NATS.Consumer+"-default")
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, time.Minute, "the job delivered again, its first delivery not settled", func() bool {
		info, err := c.Info(ctx)
		return err == nil && info.Delivered.Consumer >= 2
	})
	s, err := js.Stream(ctx, queue.JobStream(b.cfg.NATS, job.DefaultTenant))
	if err != nil {
		t.Fatal(err)
	}
	if info, err := s.Info(ctx); err != nil || info.State.Msgs != 1 {
		t.Fatalf("job stream %+v, %v while no dead-letter stream answered; want the message kept", info.State, err)
	}
	b.setAckWait(time.Duration(b.cfg.NATS.AckWait)) // setup declares the streams again
}
