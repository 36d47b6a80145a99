package runner_test

import (
	"context"
	"errors"
	"fmt"
	"path"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/boxcar-run/boxcar/internal/agent"
	"github.com/boxcar-run/boxcar/internal/job"
	"github.com/boxcar-run/boxcar/internal/queue"
	"github.com/boxcar-run/boxcar/internal/runner"
)

// TestApprovalSurvivesAHandover: a worker drained (a rolling upgrade's SIGTERM, its drain grace
// passed) while its job waits for a person's approval hands the job back, and the request it
// asked stays pending: the job's next delivery, on another worker, waits on that same request,
// at the revision and until the expiry the person was shown, and a signed answer to it, given
// before or after that delivery asks, decides the command. (It did not: the drained worker
// marked the request expired, the person's `submit approve --revision` was refused, and the
// next delivery asked again from scratch.) The protections stay: an answer to a copy the
// approvals writer put back is refused, and the request's expiry bounds the whole wait.
func TestApprovalSurvivesAHandover(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		wait time.Duration // the first worker's approval wait: the request's expiry
		// answer answers p, the request the drained worker asked (nil: nobody does).
		answer func(t *testing.T, b *bundle, id string, p queue.Approval)
		// whileAsked: answer once the next delivery waits on p, not before it asks.
		whileAsked bool
		want       decisionWant
	}{
		{name: "approved before the next delivery asks", wait: time.Minute, answer: answerAs(job.DecisionApproved), want: wantApproved},
		{name: "approved while the next delivery waits", wait: time.Minute, answer: answerAs(job.DecisionApproved), whileAsked: true, want: wantApproved},
		{name: "denied while the next delivery waits", wait: time.Minute, answer: answerAs(job.DecisionDenied), whileAsked: true, want: wantDenied},
		{name: "put back by the approvals writer and approved", wait: time.Minute, answer: func(t *testing.T, b *bundle, id string, p queue.Approval) {
			p.RequestedAt, p.ExpiresAt = time.Now().UTC(), time.Now().UTC().Add(time.Hour)
			rawPut(t, b, id, p)
			decide(t, b, id, asAlice)
		}, want: wantRefused},
		// Long enough for the drain to come first on a busy machine; the next delivery's
		// own wait is an hour.
		{name: "nobody answers", wait: 20 * time.Second, want: wantTimedOut},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			j, p, drained := b.drainAsking(tc.wait)
			if drained.Approved || drained.Refused != "" {
				t.Fatalf("the drained worker's answer: %+v", drained.Answer)
			}
			if got, _, err := b.q.PendingApprovals(context.Background(), j.ID); err != nil || len(got) != 1 || got[0].Revision != p.Revision {
				t.Errorf("after the drain the bucket holds %+v, %v; want the request at revision %d still pending", got, err, p.Revision)
			}
			if st, err := b.q.Status(context.Background(), j.ID); err != nil || st.Asked["call_1"].Expired {
				t.Errorf("after the drain the job's status records %+v, %v; want the request not expired", st.Asked, err)
			}
			if tc.answer != nil && !tc.whileAsked {
				tc.answer(t, b, j.ID, p)
			}
			answers := make(chan approval, 1)
			b.worker(askingAgent(time.Hour, answers), withApprovals)
			if tc.whileAsked {
				b.waitAskedAgain(j.ID, p)
				tc.answer(t, b, j.ID, p)
			}
			var a approval
			select {
			case a = <-answers:
			case <-time.After(2 * time.Minute):
				t.Fatalf("the next delivery still waits, past the request's expiry %s", p.ExpiresAt.Format(time.RFC3339))
			}
			tc.want.check(t, a)
			if st := b.waitFinal(j.ID, time.Minute); st.State != job.StateSucceeded {
				t.Errorf("final state %s, want succeeded", st.State)
			}
		})
	}
}

// drainAsking submits a job to a worker whose agent asks for approval (its wait bounded by
// wait: the request's expiry) and drains that worker while the job waits (drain_grace is 1s,
// then the job is handed back). It returns the job, the request its worker asked and the
// drained agent's answer.
func (b *bundle) drainAsking(wait time.Duration) (job.Job, queue.Approval, approval) {
	b.t.Helper()
	drained := make(chan approval, 1)
	first := b.worker(askingAgent(wait, drained), withApprovals)
	j := b.submit("p")
	p := b.waitPending(j.ID)
	first.stop()
	return j, p, <-drained
}

// answerAs answers the request p as alice, bound to p's revision, as `submit approve JOB
// call_1 --revision N` does with the line the job's status showed.
func answerAs(d job.Decision) func(t *testing.T, b *bundle, id string, p queue.Approval) {
	return func(t *testing.T, b *bundle, id string, p queue.Approval) {
		t.Helper()
		if _, err := b.q.DecideApproval(context.Background(), id, "call_1", p.Revision, d, "alice", "", asAlice); err != nil {
			t.Fatalf("%s the request shown, after its worker was drained: %v", d, err)
		}
	}
}

// waitAskedAgain waits until the job's next delivery waits on the request p, as its progress
// line shows: the same revision, the same expiry.
func (b *bundle) waitAskedAgain(id string, p queue.Approval) {
	b.t.Helper()
	want := fmt.Sprintf("waiting until %s for approval of call call_1", p.ExpiresAt.Format(time.RFC3339))
	rev := fmt.Sprintf("--revision %d", p.Revision)
	var last job.Status
	defer func() {
		if b.t.Failed() { // the wait ended the test (t.Fatal runs the defers)
			b.t.Logf("last status: attempt %d, %s: %s", last.Attempt, last.State, last.Progress)
		}
	}()
	waitFor(b.t, 30*time.Second, "the next delivery waiting on the same request", func() bool {
		st, err := b.q.Status(context.Background(), id)
		last = st
		return err == nil && st.Attempt == 2 && st.State == job.StateWaitingApproval &&
			strings.Contains(st.Progress, want) && strings.Contains(st.Progress, rev)
	})
}

// decisionWant is what the next delivery's agent must be told.
type decisionWant int

const (
	wantApproved decisionWant = iota
	wantDenied
	wantRefused
	wantTimedOut
)

func (w decisionWant) check(t *testing.T, a approval) {
	t.Helper()
	var ok bool
	switch w {
	case wantApproved:
		ok = a.Approved && a.By == "alice" && a.err == nil
	case wantDenied:
		ok = !a.Approved && a.By == "alice" && a.Refused == "" && a.err == nil
	case wantRefused:
		ok = !a.Approved && a.Refused != "" && a.By == ""
	case wantTimedOut:
		ok = !a.Approved && a.By == "" && errors.Is(a.err, context.DeadlineExceeded)
	}
	if !ok {
		t.Errorf("the next delivery's answer: %+v, %v; want %v", a.Answer, a.err, []string{"approved by alice", "denied by alice", "refused", "no answer"}[w])
	}
}

// TestApprovalLeftPendingEndsWithTheJob: a request its drained worker left pending for the
// job's next delivery, which ends the job without asking it again (the model went another way,
// or its calls have other ids), is marked expired when the job ends: a person's answer to it
// is refused, not recorded for a command nothing will run.
func TestApprovalLeftPendingEndsWithTheJob(t *testing.T) {
	t.Parallel()
	b := setup(t)
	j, p, _ := b.drainAsking(time.Minute)
	b.worker(agentFunc(writeReport), withApprovals)
	if st := b.waitFinal(j.ID, time.Minute); st.State != job.StateSucceeded {
		t.Fatalf("final state %s, want succeeded", st.State)
	}
	// The request is expired once the end is settled, just after the status says it.
	waitFor(t, 30*time.Second, "the request left pending expired", func() bool {
		a, err := b.q.Approval(context.Background(), j.ID, "call_1")
		return err == nil && a.Decision != ""
	})
	_, err := b.q.DecideApproval(context.Background(), j.ID, "call_1", p.Revision, job.DecisionApproved, "alice", "", asAlice)
	if !errors.Is(err, queue.ErrApprovalExpired) || !strings.Contains(err.Error(), "the job ended succeeded") {
		t.Errorf("answer after the job ended: %v, want ErrApprovalExpired saying the job ended", err)
	}
	if st, err := b.q.Status(context.Background(), j.ID); err != nil || !st.Asked["call_1"].Expired {
		t.Errorf("the ended job's status records %+v, %v; want the request expired", st.Asked, err)
	}
}

// TestApprovalLeftPendingEndsWithAnAdoptedRun: a request left pending by a drained worker is
// marked expired also when the job ends by adoption: the next delivery, going another way,
// commits the run and its worker dies before the status says so, and the one after ends the
// job as the manifest says. (It stayed pending: only an end the settling delivery decided
// expired it, and a person's answer was recorded for a command nothing would run.)
func TestApprovalLeftPendingEndsWithAnAdoptedRun(t *testing.T) {
	t.Parallel()
	b := setup(t)
	j, p, _ := b.drainAsking(time.Minute)

	var second atomic.Pointer[worker] // set before the manifest's create, read by the hook
	committed := make(chan struct{})
	dies := &hookStore{Store: b.shared, afterCreate: func(key string) {
		if path.Base(key) == "manifest.json" {
			second.Load().nc.Close() // killed between the commit and the status
			close(committed)
		}
	}}
	second.Store(b.worker(agentFunc(writeReport), withApprovals, func(c *runner.Config) { c.Store = dies }))
	<-committed
	b.worker(agentFunc(func(ctx context.Context, req agent.Request) (agent.Result, error) {
		t.Errorf("the committed job ran again")
		return writeReport(ctx, req)
	}), withApprovals)
	if st := b.waitFinal(j.ID, time.Minute); st.State != job.StateSucceeded {
		t.Fatalf("final state %s, want succeeded", st.State)
	}
	waitFor(t, 30*time.Second, "the request left pending expired", func() bool {
		a, err := b.q.Approval(context.Background(), j.ID, "call_1")
		return err == nil && a.Decision != ""
	})
	if _, err := b.q.DecideApproval(context.Background(), j.ID, "call_1", p.Revision, job.DecisionApproved, "alice", "", asAlice); !errors.Is(err, queue.ErrApprovalExpired) {
		t.Errorf("answer after the adopted run ended the job: %v, want ErrApprovalExpired", err)
	}
}

// TestApprovalLeftPendingEndsWithACancel: a request left pending by a drained worker is marked
// expired when the job, handed back and queued, is cancelled: the worker's cancel watch ends
// it (job.RequestCancel) with no delivery to settle it. (It stayed pending: only a delivery's
// end expired such requests, and a delivery that finds the job cancelled records nothing, so a
// person's signed answer was recorded for a command nothing would run.)
func TestApprovalLeftPendingEndsWithACancel(t *testing.T) {
	t.Parallel()
	b := setup(t)
	j, p, _ := b.drainAsking(time.Minute)
	// A worker that fetches no job: its cancel watch alone ends the queued job.
	b.worker(agentFunc(func(context.Context, agent.Request) (agent.Result, error) {
		return agent.Result{}, errors.New("the watching worker ran a job")
	}), withApprovals, func(c *runner.Config) { c.ModelGate = neverUp{} })
	if _, err := b.q.Cancel(context.Background(), j.ID, "tester"); err != nil {
		t.Fatal(err)
	}
	if st := b.waitFinal(j.ID, time.Minute); st.State != job.StateCancelled {
		t.Fatalf("final state %s, want cancelled", st.State)
	}
	waitFor(t, 30*time.Second, "the request left pending expired", func() bool {
		a, err := b.q.Approval(context.Background(), j.ID, "call_1")
		return err == nil && a.Decision != ""
	})
	_, err := b.q.DecideApproval(context.Background(), j.ID, "call_1", p.Revision, job.DecisionApproved, "alice", "", asAlice)
	if !errors.Is(err, queue.ErrApprovalExpired) || !strings.Contains(err.Error(), "the job ended cancelled") {
		t.Errorf("answer after the job was cancelled: %v, want ErrApprovalExpired saying the job ended", err)
	}
	if st, err := b.q.Status(context.Background(), j.ID); err != nil || !st.Asked["call_1"].Expired {
		t.Errorf("the cancelled job's status records %+v, %v; want the request expired", st.Asked, err)
	}
}
