package runner_test

import (
	"context"
	"errors"
	"io"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/boxcar-run/boxcar/internal/agent"
	"github.com/boxcar-run/boxcar/internal/config"
	"github.com/boxcar-run/boxcar/internal/job"
	"github.com/boxcar-run/boxcar/internal/runner"
	"github.com/boxcar-run/boxcar/internal/store"
)

// TestAuditCancelledQueuedJobRejectedAtAdmitKeepsOneEnd: a job is cancelled while it waits in
// the queue (no worker has looked at it yet), and the worker that then delivers it cannot
// admit it (its profile is one this worker does not define, and no peer does). The cancel
// came first: the status says cancelled. The delivery never reaches the claim, which is where
// a cancel is honoured, so it commits a manifest that says rejected and dead-letters the job
// as unknown_profile under a status that says cancelled. One job, two ends: `submit status`
// says cancelled, `submit manifest`/`verify` and the dead letter say rejected.
func TestAuditCancelledQueuedJobRejectedAtAdmitKeepsOneEnd(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	j := b.newJob("nope", "t") // a profile no worker defines
	b.publish(j)
	st, err := b.q.Cancel(ctx, j.ID, "tester")
	if err != nil || !st.CancelRequested {
		t.Fatalf("cancel of the queued job: %+v, %v", st, err)
	}
	b.worker(agentFunc(writeReport))
	final := b.waitFinal(j.ID, 20*time.Second)
	waitFor(t, 20*time.Second, "the job's manifest", func() bool {
		_, err := b.store.Stat(ctx, store.ManifestKey(j.ID))
		return err == nil
	})
	waitFor(t, 20*time.Second, "the job to be consumed", b.consumed)
	m := b.manifest(j.ID)
	var letters []string
	for _, dl := range b.deadLetters() {
		if dl.JobID == j.ID {
			letters = append(letters, dl.Reason)
		}
	}
	if final.State != m.Predicate.Outcome.State {
		t.Errorf("status says %s (%q), the committed manifest %s (%q), dead letters %q: the job has two ends",
			final.State, final.Error, m.Predicate.Outcome.State, m.Predicate.Outcome.Error, letters)
	}
	if final.State == job.StateCancelled && len(letters) > 0 {
		t.Errorf("a job whose status says cancelled was dead-lettered: %q", letters)
	}
}

// slowStore delays the puts delay names (outside any lock, so that other writers go on).
type slowStore struct {
	store.Store
	delay func(key string)
}

func (s *slowStore) Put(ctx context.Context, key string, r io.Reader, size int64) error {
	s.delay(key)
	return s.Store.Put(ctx, key, r, size)
}

func (s *slowStore) PutIfAbsent(ctx context.Context, key string, r io.Reader, size int64) error {
	s.delay(key)
	return s.Store.PutIfAbsent(ctx, key, r, size)
}

// TestAuditCancelledRunsCommitKeepsItsDelivery: a job is cancelled mid-run on its last
// delivery, and the upload of what its run produced takes longer than the consumer's ack
// wait (a slow store, large artifacts). The cancel ends the attempt's context, and with it
// the delivery's heartbeats (KeepAlive runs on that context), while the commit goes on on a
// context that survives the cancel. The server delivers the job again; that delivery is past
// max_deliver, ends the job dead and dead-letters it max_deliveries, and the cancelled run's
// commit loses. A job the user cancelled ends dead, dead-lettered, its run's report gone.
// (On an earlier delivery, the redelivery commits a one-line "cancelled" manifest instead and
// the run's report and artifacts are thrown away, against "a run cancelled before keeps what
// it produced".)
func TestAuditCancelledRunsCommitKeepsItsDelivery(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		name string
		last bool
	}{{"last delivery", true}, {"earlier delivery", false}} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			if tt.last {
				oneDelivery(b)
			}
			b.setAckWait(3 * time.Second)
			ctx := context.Background()
			j := b.newJob("p", "t")
			var once atomic.Bool
			slow := &slowStore{Store: b.shared, delay: func(key string) {
				if strings.Contains(key, j.ID+"/attempts/1-") && once.CompareAndSwap(false, true) {
					time.Sleep(7 * time.Second) // over two ack waits: the store is slow, not down
				}
			}}
			started := make(chan struct{}, 1)
			b.worker(agentFunc(func(ctx context.Context, req agent.Request) (agent.Result, error) {
				if req.Spent.Turns > 0 {
					return agent.Result{}, errors.New("the job ran again") // not this test's point
				}
				req.Progress(agent.Event{Kind: agent.EventModelRequest, Turn: 1, MaxToolCalls: 30, Spent: agent.Budget{Turns: 1}})
				if err := req.Sandbox.WriteFile(ctx, "report.md", []byte("# half a report for "+req.JobID+"\n")); err != nil {
					return agent.Result{}, err
				}
				started <- struct{}{}
				<-ctx.Done()
				return agent.Result{Turns: 1}, ctx.Err()
			}), func(c *runner.Config) { c.Store = slow; c.CleanupTimeout = 30 * time.Second })
			b.publish(j)
			<-started
			if _, err := b.q.Cancel(ctx, j.ID, "tester"); err != nil {
				t.Fatal(err)
			}
			st := b.waitFinal(j.ID, 40*time.Second)
			waitFor(t, 40*time.Second, "the job to be consumed", b.consumed)
			m := b.manifest(j.ID)
			var letters []string
			for _, dl := range b.deadLetters() {
				if dl.JobID == j.ID {
					letters = append(letters, dl.Reason+": "+dl.Error)
				}
			}
			if st.State != job.StateCancelled || m.Predicate.Outcome.State != job.StateCancelled || len(letters) > 0 {
				t.Errorf("job cancelled mid-run ended: status %s (%q), manifest %s (attempt %d), dead letters %q; want cancelled, no dead letter",
					st.State, st.Error, m.Predicate.Outcome.State, m.Predicate.Attempt, letters)
			}
			if m.Predicate.Attempt != 1 {
				t.Errorf("the committed manifest is attempt %d's, not the cancelled run's (attempt 1): what the run produced was discarded", m.Predicate.Attempt)
			}
		})
	}
}

// stallingGetStore answers a Get of the keys stall names with a body that gives its first
// bytes and then nothing until the request's context ends: a store (or a proxy in front of
// it) that stops sending mid-body. The S3 client has no read timeout (its http.Client's
// Timeout is the SDK's, zero), so only the request's context ends such a read.
type stallingGetStore struct {
	store.Store
	stall func(key string) bool
}

func (s *stallingGetStore) Get(ctx context.Context, key string) (io.ReadCloser, error) {
	rc, err := s.Store.Get(ctx, key)
	if err != nil || !s.stall(key) {
		return rc, err
	}
	return &stalledBody{ctx: ctx, rc: rc}, nil
}

type stalledBody struct {
	ctx  context.Context
	rc   io.ReadCloser
	sent bool
}

func (b *stalledBody) Read(p []byte) (int, error) {
	if !b.sent && len(p) > 0 {
		b.sent = true
		return b.rc.Read(p[:1])
	}
	<-b.ctx.Done()
	return 0, b.ctx.Err()
}

func (b *stalledBody) Close() error { return b.rc.Close() }

// TestAuditJobTimeoutBoundsTheInputCopy: job_timeout "bounds the whole job" (config), and an
// attempt "holds its slot at most twice its job_timeout" (lifecycle.md). The copy of the
// inputs into the sandbox runs on the attempt's context, which has no deadline: a store that
// stops sending an input's body mid-stream holds the job in `running` / "copying inputs",
// its delivery kept alive by heartbeats, and the worker's slot, for ever. Here job_timeout is
// 1s; the job is still running 15 s later.
func TestAuditJobTimeoutBoundsTheInputCopy(t *testing.T) {
	t.Parallel()
	b := setup(t)
	p := b.cfg.Profiles["p"]
	p.Limits.JobTimeout = config.Duration(time.Second) // the attempt gives up after 2 s at most
	b.cfg.Profiles = map[string]config.Profile{"p": p}
	stalling := &stallingGetStore{Store: b.shared, stall: func(key string) bool { return strings.Contains(key, "inputs/") }}
	ran := make(chan struct{}, 1)
	b.worker(agentFunc(func(ctx context.Context, req agent.Request) (agent.Result, error) {
		ran <- struct{}{}
		return writeReport(ctx, req)
	}), func(c *runner.Config) { c.Store = stalling })
	j := b.submit("p")
	time.Sleep(15 * time.Second) // over seven times the attempt's bound
	st, err := b.q.Status(context.Background(), j.ID)
	if err != nil {
		t.Fatal(err)
	}
	if st.State == job.StateRunning && st.Attempt == 1 {
		t.Errorf("job_timeout 1s: 15s later attempt 1 is still %s (progress %q, started %s ago): the input copy ignores the job's timeout",
			st.State, st.Progress, time.Since(st.StartedAt).Round(time.Second))
	}
}
