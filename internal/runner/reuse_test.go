package runner_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/boxcar-run/boxcar/internal/agent"
	"github.com/boxcar-run/boxcar/internal/job"
	"github.com/boxcar-run/boxcar/internal/queue"
)

// TestRedeliveryReusesOnlyTheAnswerItsWorkerAsked: a redelivered attempt that asks about the
// command of call_1 again reuses the answer an earlier attempt got, but only the answer to the
// request that attempt's worker wrote, before it expired. A writer of the tenant's approvals
// (its approver's NATS login, which signs nothing) that puts the request back as pending with
// an expiry of its own, once the worker gave up on it or once it was denied, gets a person to
// sign an approval of a request no worker asked: the next attempt must not run the command on
// it. (It did: a reused answer was checked against no revision and no expiry.)
func TestRedeliveryReusesOnlyTheAnswerItsWorkerAsked(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		wait time.Duration // the first attempt's approval timeout
		// first answers the first attempt's request p (nil: nobody does, it expires).
		first func(t *testing.T, b *bundle, id string)
		// rewrite: the approver's login puts the request back as pending, and alice, shown
		// it, approves.
		rewrite bool
		// later: the job asked job.MaxAsked requests after call_1's, as an attempt running
		// on writes them, and its status forgot call_1's.
		later bool
		want  bool // the second attempt's command approved
	}{
		{name: "expired, put back and approved", wait: 2 * time.Second, rewrite: true},
		{name: "denied, put back and approved", wait: time.Minute, rewrite: true, first: func(t *testing.T, b *bundle, id string) {
			if _, err := b.q.DecideApproval(context.Background(), id, "call_1", 0, job.DecisionDenied, "alice", "no", asAlice); err != nil {
				t.Fatal(err)
			}
		}},
		{name: "approved, the worker killed before the command ran", wait: time.Minute, want: true, first: func(t *testing.T, b *bundle, id string) {
			decide(t, b, id, asAlice)
		}},
		{name: "approved, then forgotten past the status' bound", wait: time.Minute, later: true, first: func(t *testing.T, b *bundle, id string) {
			decide(t, b, id, asAlice)
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			firstAnswers := make(chan approval, 1)
			ask := askingAgent(tc.wait, firstAnswers)
			dying := b.worker(agentFunc(func(ctx context.Context, req agent.Request) (agent.Result, error) {
				if _, err := ask(ctx, req); err != nil {
					return agent.Result{}, err
				}
				<-ctx.Done() // killed before it goes on
				return agent.Result{}, ctx.Err()
			}), withApprovals)
			j := b.submit("p")
			if tc.first != nil {
				b.waitPending(j.ID)
				tc.first(t, b, j.ID)
			}
			<-firstAnswers
			dying.nc.Close()
			dying.stop()
			if tc.rewrite {
				now := time.Now().UTC()
				rawPut(t, b, j.ID, queue.Approval{Tenant: job.DefaultTenant, JobID: j.ID, CallID: "call_1", Argv: []string{"make", "test"},
					Attempt: 1, Worker: b.cfg.WorkerID, RequestedAt: now, ExpiresAt: now.Add(time.Hour)})
				decide(t, b, j.ID, asAlice)
			}
			if tc.later {
				askedLater(t, b, j.ID)
			}
			answers := make(chan approval, 1)
			b.worker(askingAgent(time.Minute, answers), withApprovals)
			a := <-answers
			if a.Approved != tc.want {
				t.Errorf("the redelivered attempt's answer: %+v, %v; want approved %v", a.Answer, a.err, tc.want)
			}
			if tc.want && a.By != "alice" {
				t.Errorf("approved by %q, want alice", a.By)
			}
			if !tc.want && a.Refused == "" {
				t.Errorf("answer %+v: want a refusal that says why", a.Answer)
			}
			if st := b.waitFinal(j.ID, time.Minute); st.State != job.StateSucceeded {
				t.Errorf("final state %s, want succeeded", st.State)
			}
		})
	}
}

// askedLater records in the job's status job.MaxAsked requests asked after those it holds, as
// the workers of a job whose every call is an "ask" write them.
func askedLater(t *testing.T, b *bundle, id string) {
	t.Helper()
	_, q := b.connect()
	_, err := q.UpdateStatus(context.Background(), queue.Ref{Tenant: job.DefaultTenant, ID: id}, func(s *job.Status) {
		for i := range job.MaxAsked {
			s.RecordAsked(fmt.Sprint("call_later_", i), job.Asked{Revision: uint64(1<<40 + i), ExpiresAt: time.Now().Add(time.Hour)})
		}
	})
	if err != nil {
		t.Fatal(err)
	}
}
