package queue_test

import (
	"context"
	"errors"
	"reflect"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/boxcar-run/boxcar/internal/job"
	"github.com/boxcar-run/boxcar/internal/queue"
	"github.com/boxcar-run/boxcar/test/harness"
)

func pendingApproval(jobID, callID string, argv []string, timeout time.Duration) queue.Approval {
	now := time.Now().UTC()
	return queue.Approval{Tenant: tenant, JobID: jobID, CallID: callID, Argv: argv, Attempt: 1, Worker: "w1", RequestedAt: now, ExpiresAt: now.Add(timeout)}
}

func TestApprovalAnsweredOnce(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	tests := []struct {
		name     string
		decision job.Decision
		reason   string
	}{
		{name: "approve", decision: job.DecisionApproved},
		{name: "deny", decision: job.DecisionDenied, reason: "not on a Friday"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			id, callID := newJob(t).ID, "call_"+tt.name
			argv := []string{"make", "deploy", "--env", "prod"}
			got, err := b.w.RequestApproval(ctx, pendingApproval(id, callID, argv, time.Minute))
			if err != nil {
				t.Fatalf("RequestApproval: %v", err)
			}
			if got.Decision != "" || !reflect.DeepEqual(got.Argv, argv) {
				t.Fatalf("request = %+v, want it pending with the argv", got)
			}
			pending, _, err := b.c.PendingApprovals(ctx, id)
			if err != nil || len(pending) != 1 || pending[0].CallID != callID {
				t.Fatalf("pending = %+v, %v; want the one request", pending, err)
			}

			// The worker waits; a client answers through its own handle.
			waited := make(chan queue.Approval, 1)
			waitErr := make(chan error, 1)
			go func() {
				a, err := b.w.WaitApproval(ctx, ref(id), callID)
				waited <- a
				waitErr <- err
			}()
			client, err := queue.NewClient(ctx, b.nc, b.cfg, "default")
			if err != nil {
				t.Fatal(err, "default")
			}
			answer, err := client.DecideApproval(ctx, id, callID, 0, tt.decision, "alice@host", tt.reason, nil)
			if err != nil {
				t.Fatalf("DecideApproval: %v", err)
			}
			if answer.Decision != tt.decision || answer.DecidedBy != "alice@host" || answer.Reason != tt.reason || answer.DecidedAt.IsZero() {
				t.Errorf("answer = %+v", answer)
			}
			select {
			case a := <-waited:
				if err := <-waitErr; err != nil || a.Decision != tt.decision || a.Reason != tt.reason {
					t.Errorf("WaitApproval = %+v, %v; want %s", a, err, tt.decision)
				}
			case <-time.After(harness.Timeout(10 * time.Second)):
				t.Fatal("WaitApproval did not return after the answer")
			}

			// A second answer, either way, is refused and names the first.
			for _, d := range []job.Decision{job.DecisionApproved, job.DecisionDenied} {
				_, err := client.DecideApproval(ctx, id, callID, 0, d, "bob@host", "", nil)
				if !errors.Is(err, queue.ErrAlreadyDecided) || !strings.Contains(err.Error(), "alice@host") {
					t.Errorf("second answer %s: %v, want ErrAlreadyDecided naming alice@host", d, err)
				}
			}
			// The worker's expiry comes too late to change it.
			if a, err := b.w.ExpireApproval(ctx, ref(id), callID, "no answer within 1m0s"); err != nil || a.Decision != tt.decision {
				t.Errorf("ExpireApproval after the answer = %+v, %v; want the answer kept", a, err)
			}
			if pending, _, err := client.PendingApprovals(ctx, id); err != nil || len(pending) != 0 {
				t.Errorf("pending after the answer = %+v, %v; want none", pending, err)
			}
			// The same command asked again (a redelivered job) gets the answer without asking.
			again, err := b.w.RequestApproval(ctx, pendingApproval(id, callID, argv, time.Minute))
			if err != nil || again.Decision != tt.decision || again.DecidedBy != "alice@host" {
				t.Errorf("asking again = %+v, %v; want the earlier answer", again, err)
			}
			// Another command under the same call id is a new request.
			other, err := b.w.RequestApproval(ctx, pendingApproval(id, callID, []string{"make", "clean"}, time.Minute))
			if err != nil || other.Decision != "" {
				t.Errorf("another command = %+v, %v; want a new pending request", other, err)
			}
		})
	}
}

func TestApprovalExpiry(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	id := newJob(t).ID

	t.Run("worker gives up", func(t *testing.T) {
		if _, err := b.w.RequestApproval(ctx, pendingApproval(id, "c1", []string{"ls"}, time.Minute)); err != nil {
			t.Fatal(err)
		}
		wctx, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
		defer cancel()
		if _, err := b.w.WaitApproval(wctx, ref(id), "c1"); !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("WaitApproval = %v, want DeadlineExceeded", err)
		}
		a, err := b.w.ExpireApproval(ctx, ref(id), "c1", "no answer within 100ms")
		if err != nil || a.Decision != job.DecisionExpired || a.DecidedBy != queue.Expirer {
			t.Fatalf("ExpireApproval = %+v, %v", a, err)
		}
		_, err = b.c.DecideApproval(ctx, id, "c1", 0, job.DecisionApproved, "alice", "", nil)
		if !errors.Is(err, queue.ErrApprovalExpired) || !strings.Contains(err.Error(), "no answer within 100ms") {
			t.Errorf("late answer: %v, want ErrApprovalExpired with the reason", err)
		}
	})

	t.Run("deadline passed before the worker noticed", func(t *testing.T) {
		a := pendingApproval(id, "c2", []string{"ls"}, time.Minute)
		a.RequestedAt, a.ExpiresAt = a.RequestedAt.Add(-job.ClockSkew-2*time.Minute), a.RequestedAt.Add(-job.ClockSkew-time.Minute)
		if _, err := b.w.RequestApproval(ctx, a); err != nil {
			t.Fatal(err)
		}
		if pending, _, err := b.c.PendingApprovals(ctx, ""); err != nil || len(pending) != 0 {
			t.Errorf("pending = %+v, %v; want the expired request left out", pending, err)
		}
		if _, err := b.c.DecideApproval(ctx, id, "c2", 0, job.DecisionApproved, "alice", "", nil); !errors.Is(err, queue.ErrApprovalExpired) {
			t.Errorf("answer after expires_at: %v, want ErrApprovalExpired", err)
		}
	})

	// The worker's clock runs 5 minutes behind the answerer's: its request, 5 minutes long,
	// has just run out by the answerer's clock while the worker still waits for it. It is
	// listed and its answer taken; the worker's clock decides when the wait ends.
	t.Run("the answerer's clock is ahead of the worker's", func(t *testing.T) {
		a := pendingApproval(id, "c3", []string{"ls"}, 5*time.Minute)
		a.RequestedAt, a.ExpiresAt = a.RequestedAt.Add(-5*time.Minute), a.ExpiresAt.Add(-5*time.Minute)
		if _, err := b.w.RequestApproval(ctx, a); err != nil {
			t.Fatal(err)
		}
		pending, _, err := b.c.PendingApprovals(ctx, "")
		if err != nil || !slices.ContainsFunc(pending, func(p queue.Approval) bool { return p.CallID == "c3" }) {
			t.Errorf("pending = %+v, %v; want the request the worker still waits for listed", pending, err)
		}
		if _, err := b.c.DecideApproval(ctx, id, "c3", 0, job.DecisionApproved, "alice", "", nil); err != nil {
			t.Errorf("answer within the worker's wait: %v", err)
		}
	})

	t.Run("an expired request asked again is asked anew", func(t *testing.T) {
		a, err := b.w.RequestApproval(ctx, pendingApproval(id, "c1", []string{"ls"}, time.Minute))
		if err != nil || a.Decision != "" {
			t.Fatalf("RequestApproval = %+v, %v; want pending again", a, err)
		}
		if _, err := b.c.DecideApproval(ctx, id, "c1", 0, job.DecisionApproved, "alice", "", nil); err != nil {
			t.Errorf("answer to the new request: %v", err)
		}
	})
}

func TestApprovalRequests(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	j1, j2 := newJob(t).ID, newJob(t).ID

	// A call id that cannot be a key token as it is still works, under its own name.
	odd := "call:9f/ä b?*>"
	for _, a := range []queue.Approval{
		pendingApproval(j1, "call_a", []string{"ls", "-l"}, time.Minute),
		pendingApproval(j2, odd, []string{"make"}, time.Minute),
		pendingApproval(j1, "call_b", []string{"make", "test"}, time.Minute),
	} {
		if _, err := b.w.RequestApproval(ctx, a); err != nil {
			t.Fatalf("RequestApproval %s: %v", a.CallID, err)
		}
	}
	var all []string
	pending, _, err := b.c.PendingApprovals(ctx, "")
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range pending {
		all = append(all, a.CallID)
	}
	if want := []string{"call_a", odd, "call_b"}; !reflect.DeepEqual(all, want) {
		t.Errorf("pending = %q, want %q oldest first", all, want)
	}
	if one, _, err := b.c.PendingApprovals(ctx, j2); err != nil || len(one) != 1 || one[0].CallID != odd {
		t.Errorf("pending of %s = %+v, %v", j2, one, err)
	}
	if a, err := b.c.DecideApproval(ctx, j2, odd, 0, job.DecisionDenied, "alice", "", nil); err != nil || a.CallID != odd {
		t.Errorf("answer under the odd call id = %+v, %v", a, err)
	}

	tests := []struct {
		name    string
		decide  func() error
		wantErr error
	}{
		{name: "unknown call", decide: func() error {
			_, err := b.c.DecideApproval(ctx, j1, "call_nope", 0, job.DecisionApproved, "alice", "", nil)
			return err
		}, wantErr: queue.ErrUnknownApproval},
		{name: "not a job id", decide: func() error {
			_, err := b.c.DecideApproval(ctx, "../../x", "call_a", 0, job.DecisionApproved, "alice", "", nil)
			return err
		}, wantErr: queue.ErrUnknownApproval},
		{name: "not a decision", decide: func() error {
			_, err := b.c.DecideApproval(ctx, j1, "call_a", 0, job.DecisionExpired, "alice", "", nil)
			return err
		}},
		{name: "command too long to ask about", decide: func() error {
			_, err := b.w.RequestApproval(ctx, pendingApproval(j1, "call_c", []string{strings.Repeat("x", 100<<10)}, time.Minute))
			return err
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.decide()
			if err == nil || (tt.wantErr != nil && !errors.Is(err, tt.wantErr)) {
				t.Errorf("error = %v, want %v", err, tt.wantErr)
			}
		})
	}

	// Two people answering at once: exactly one answer counts.
	var wg sync.WaitGroup
	errs := make([]error, 2)
	for i, d := range []job.Decision{job.DecisionApproved, job.DecisionDenied} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, errs[i] = b.c.DecideApproval(ctx, j1, "call_b", 0, d, "person", "", nil)
		}()
	}
	wg.Wait()
	if (errs[0] == nil) == (errs[1] == nil) {
		t.Errorf("concurrent answers: %v and %v; want exactly one to succeed", errs[0], errs[1])
	}
	for _, err := range errs {
		if err != nil && !errors.Is(err, queue.ErrAlreadyDecided) {
			t.Errorf("the losing answer: %v, want ErrAlreadyDecided", err)
		}
	}
}
