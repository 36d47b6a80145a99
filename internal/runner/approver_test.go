package runner_test

import (
	"context"
	"crypto/ed25519"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/boxcar-run/boxcar/internal/agent"
	"github.com/boxcar-run/boxcar/internal/approvalsig"
	"github.com/boxcar-run/boxcar/internal/job"
	"github.com/boxcar-run/boxcar/internal/provenance"
	"github.com/boxcar-run/boxcar/internal/queue"
	"github.com/boxcar-run/boxcar/internal/runner"
)

// alice is the approver the test workers trust; her answers are signed with aliceKey.
var aliceKey, alicePub = func() (ed25519.PrivateKey, ed25519.PublicKey) {
	pub, priv, err := ed25519.GenerateKey(nil)
	if err != nil {
		panic(err)
	}
	return priv, pub
}()

// asAlice signs answers with alice's key.
var asAlice = approvalsig.Signer(aliceKey)

// withApprovals gives the runner the queue as its approvals transport, trusting alice.
func withApprovals(c *runner.Config) {
	c.Approvals = c.Queue.(*queue.Consumer)
	c.ApproverKeys = provenance.SingleKey("alice", alicePub)
}

// approval is what one Approve call returned.
type approval struct {
	agent.Answer
	err error
}

// askingAgent asks once for ["make", "test"] under call id "call_1", its wait bounded by wait
// as the real agent bounds it by the profile's approval timeout, and reports the answer.
func askingAgent(wait time.Duration, answers chan<- approval) agentFunc {
	return func(ctx context.Context, req agent.Request) (agent.Result, error) {
		if req.Approver == nil {
			answers <- approval{err: errors.New("no Approver in the request")}
			return agent.Result{}, errors.New("no approver")
		}
		actx, cancel := context.WithTimeout(ctx, wait)
		defer cancel()
		ans, err := req.Approver.Approve(actx, agent.ApprovalRequest{JobID: req.JobID, CallID: "call_1", Argv: []string{"make", "test"}})
		answers <- approval{ans, err}
		if ctx.Err() != nil {
			return agent.Result{}, ctx.Err()
		}
		return agent.Result{Outcome: agent.OutcomeCompleted, FinalMessage: "done"}, nil
	}
}

// waitPending waits until the job's request is in the approvals bucket and the job shows it.
func (b *bundle) waitPending(id string) queue.Approval {
	b.t.Helper()
	var got []queue.Approval
	waitFor(b.t, 10*time.Second, "the approval request", func() bool {
		var err error
		got, _, err = b.q.PendingApprovals(context.Background(), id)
		return err == nil && len(got) == 1
	})
	waitFor(b.t, 5*time.Second, "waiting_approval", func() bool {
		st, err := b.q.Status(context.Background(), id)
		// The progress line answers the request the worker asked, at its revision.
		answer := fmt.Sprintf("submit approve %s call_1 --revision %d", id, got[0].Revision)
		return err == nil && st.State == job.StateWaitingApproval && strings.Contains(st.Progress, answer)
	})
	return got[0]
}

func TestApproverAsksAPerson(t *testing.T) {
	t.Parallel()
	b := setup(t)
	answers := make(chan approval, 1)
	b.worker(askingAgent(time.Minute, answers), withApprovals)
	ctx := context.Background()

	t.Run("approved", func(t *testing.T) {
		j := b.submit("p")
		p := b.waitPending(j.ID)
		if p.Attempt != 1 || p.Worker != b.cfg.WorkerID || len(p.Argv) != 2 {
			t.Errorf("request = %+v", p)
		}
		decided, err := b.q.DecideApproval(ctx, j.ID, "call_1", 0, job.DecisionApproved, "mallory-claims", "", asAlice)
		if err != nil {
			t.Fatal(err)
		}
		// Who answered and when go with the answer, for the manifest.
		if a := <-answers; !a.Approved || a.err != nil || a.By != "alice" || !a.At.Equal(decided.DecidedAt) {
			t.Errorf("Approve = %+v, %v; want approved by alice at %s", a.Answer, a.err, decided.DecidedAt)
		}
		if st := b.waitFinal(j.ID, 10*time.Second); st.State != job.StateSucceeded {
			t.Errorf("final state %s, want succeeded", st.State)
		}
	})

	t.Run("denied with a reason", func(t *testing.T) {
		j := b.submit("p")
		b.waitPending(j.ID)
		decided, err := b.q.DecideApproval(ctx, j.ID, "call_1", 0, job.DecisionDenied, "alice", "use make check", asAlice)
		if err != nil {
			t.Fatal(err)
		}
		want := agent.Answer{By: "alice", At: decided.DecidedAt, Reason: "use make check"}
		if a := <-answers; a.err != nil || a.Approved || a.By != want.By || !a.At.Equal(want.At) || a.Reason != want.Reason {
			t.Errorf("Approve = %+v, %v; want %+v", a.Answer, a.err, want)
		}
		if st := b.waitFinal(j.ID, 10*time.Second); st.State != job.StateSucceeded {
			t.Errorf("final state %s, want succeeded", st.State)
		}
	})

	t.Run("cancelled while waiting", func(t *testing.T) {
		j := b.submit("p")
		b.waitPending(j.ID)
		if _, err := b.q.Cancel(ctx, j.ID, "tester"); err != nil {
			t.Fatal(err)
		}
		if a := <-answers; a.Approved || a.By != "" || !errors.Is(a.err, context.Canceled) {
			t.Errorf("Approve = %+v, %v; want no approval, nobody, and context.Canceled", a.Answer, a.err)
		}
		if st := b.waitFinal(j.ID, 10*time.Second); st.State != job.StateCancelled {
			t.Errorf("final state %s, want cancelled", st.State)
		}
		_, err := b.q.DecideApproval(ctx, j.ID, "call_1", 0, job.DecisionApproved, "alice", "", asAlice)
		if !errors.Is(err, queue.ErrApprovalExpired) || !strings.Contains(err.Error(), "the job stopped waiting") {
			t.Errorf("answer after the job ended: %v, want ErrApprovalExpired", err)
		}
	})
}

func TestApproverNoAnswerMeansDenied(t *testing.T) {
	t.Parallel()
	b := setup(t)
	answers := make(chan approval, 1)
	// Long enough for the request to be written on a busy machine: a wait that ends before
	// then is a failed request, not an unanswered one.
	b.worker(askingAgent(2*time.Second, answers), withApprovals)
	j := b.submit("p")
	a := <-answers
	// The answer says when the worker gave up, and that nobody answered.
	if a.Approved || a.By != "" || a.At.IsZero() || !errors.Is(a.err, context.DeadlineExceeded) {
		t.Errorf("Approve = %+v, %v; want no approval, nobody, the time it expired, and DeadlineExceeded", a.Answer, a.err)
	}
	if st := b.waitFinal(j.ID, 10*time.Second); st.State != job.StateSucceeded {
		t.Errorf("final state %s, want succeeded", st.State)
	}
	_, err := b.q.DecideApproval(context.Background(), j.ID, "call_1", 0, job.DecisionApproved, "alice", "", asAlice)
	if !errors.Is(err, queue.ErrApprovalExpired) || !strings.Contains(err.Error(), "no answer within") {
		t.Errorf("late answer: %v, want ErrApprovalExpired saying why", err)
	}
}

func TestApproverWithoutTransportRefuses(t *testing.T) {
	t.Parallel()
	b := setup(t)
	got := make(chan agent.Approver, 1)
	b.worker(agentFunc(func(ctx context.Context, req agent.Request) (agent.Result, error) {
		got <- req.Approver
		return agent.Result{Outcome: agent.OutcomeCompleted}, nil
	}))
	b.submit("p")
	if a := <-got; a != nil {
		t.Errorf("Approver = %v, want nil (every ask command refused) without an approvals transport", a)
	}
}

// TestSpentBudgetSurvivesAKilledWorker: what an attempt spent is in the job's status as soon
// as the agent reports it, so the next attempt, after the first worker died mid-run, starts
// from it; what that attempt spends adds to it.
func TestSpentBudgetSurvivesAKilledWorker(t *testing.T) {
	t.Parallel()
	b := setup(t)
	j, _ := b.killedMidRun(func(req agent.Request) {
		if req.Spent != (agent.Budget{}) {
			t.Errorf("first attempt starts with %+v spent, want nothing", req.Spent)
		}
		req.Progress(agent.Event{Kind: agent.EventModelRequest, Turn: 1, MaxToolCalls: 30, Spent: agent.Budget{Turns: 1}})
		req.Progress(agent.Event{Kind: agent.EventToolCall, Turn: 1, ToolCalls: 1, MaxToolCalls: 30, Tool: "read_file", Spent: agent.Budget{Turns: 1, ToolCalls: 1, Tokens: 100}})
		req.Progress(agent.Event{Kind: agent.EventModelRequest, Turn: 2, ToolCalls: 1, MaxToolCalls: 30, Spent: agent.Budget{Turns: 2, ToolCalls: 1, Tokens: 100}})
		st, err := b.q.Status(context.Background(), req.JobID)
		if err != nil || st.SpentTurns != 2 || st.SpentToolCalls != 1 || st.SpentTokens != 100 || st.Progress != "model turn 2 of 20" {
			t.Errorf("status mid-run = %+v, %v; want 2 turns, 1 tool call, 100 tokens spent", st, err)
		}
	})

	seen := make(chan agent.Budget, 1)
	b.worker(agentFunc(func(ctx context.Context, req agent.Request) (agent.Result, error) {
		seen <- req.Spent
		res, err := writeReport(ctx, req)
		res.Spent = req.Spent.Add(agent.Budget{Turns: 1, ToolCalls: 1, Tokens: 50})
		return res, err
	}))
	st := b.waitFinal(j.ID, 20*time.Second)
	if got := <-seen; got != (agent.Budget{Turns: 2, ToolCalls: 1, Tokens: 100}) {
		t.Errorf("second attempt starts with %+v spent, want the first attempt's", got)
	}
	if st.State != job.StateSucceeded || st.Attempt != 2 || st.SpentTurns != 3 || st.SpentToolCalls != 2 || st.SpentTokens != 150 {
		t.Errorf("final status = %+v, want succeeded in attempt 2 with 3 turns, 2 tool calls, 150 tokens spent", st)
	}
}
