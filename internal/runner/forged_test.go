package runner_test

import (
	"context"
	"crypto/ed25519"
	"encoding/json"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/boxcar-run/boxcar/internal/approvalsig"
	"github.com/boxcar-run/boxcar/internal/job"
	"github.com/boxcar-run/boxcar/internal/provenance"
	"github.com/boxcar-run/boxcar/internal/queue"
	"github.com/boxcar-run/boxcar/internal/runner"
)

// TestForgedApprovalsDoNotRun: an answer the worker cannot trust lets nothing run, whoever
// wrote it and whatever it claims; the worker hands the agent a refusal, which the manifest
// records as decision "refused". Each case answers a fresh job's request one way.
func TestForgedApprovalsDoNotRun(t *testing.T) {
	t.Parallel()
	_, mallory, err := ed25519.GenerateKey(nil)
	if err != nil {
		t.Fatal(err)
	}
	_, retired, err := ed25519.GenerateKey(nil)
	if err != nil {
		t.Fatal(err)
	}
	b := setup(t)
	answers := make(chan approval, 1)
	b.worker(askingAgent(time.Minute, answers), withApprovals, func(c *runner.Config) {
		// bob's key was retired before any of these answers was signed.
		c.ApproverKeys = append(c.ApproverKeys, provenance.TrustedKey{Name: "bob", Key: retired.Public().(ed25519.PublicKey), NotAfter: time.Now().Add(-time.Hour)})
	})
	// altered signs with alice's key after change alters what is signed.
	altered := func(change func(*queue.Approval)) queue.Signer {
		return func(a queue.Approval) (string, error) {
			change(&a)
			return asAlice(a)
		}
	}
	tests := []struct {
		name string
		// answer answers the pending request p of job id.
		answer func(t *testing.T, id string, p queue.Approval)
		// deniedBy is set where the answer holds a trusted denial, which stands: the entry's
		// "approved" is not what was signed.
		deniedBy string
	}{
		{name: "unsigned", answer: func(t *testing.T, id string, _ queue.Approval) {
			decide(t, b, id, nil)
		}},
		{name: "signed by a key the worker does not trust", answer: func(t *testing.T, id string, _ queue.Approval) {
			decide(t, b, id, approvalsig.Signer(mallory))
		}},
		{name: "signed by a retired key", answer: func(t *testing.T, id string, _ queue.Approval) {
			decide(t, b, id, approvalsig.Signer(retired))
		}},
		{name: "replayed from an earlier request", answer: func(t *testing.T, id string, _ queue.Approval) {
			decide(t, b, id, altered(func(a *queue.Approval) { a.Revision-- }))
		}},
		{name: "another command (argv mismatch)", answer: func(t *testing.T, id string, _ queue.Approval) {
			decide(t, b, id, altered(func(a *queue.Approval) { a.Argv = []string{"make", "test", "deploy"} }))
		}},
		// Later than the expiry by more than the clocks may be apart (job.ClockSkew): nearer,
		// it may be an approver's clock ahead of the worker's, which still waits.
		{name: "signed after the request expired", answer: func(t *testing.T, id string, _ queue.Approval) {
			decide(t, b, id, altered(func(a *queue.Approval) { a.DecidedAt = a.ExpiresAt.Add(job.ClockSkew + time.Second) }))
		}},
		{name: "another job's signed answer", answer: func(t *testing.T, id string, _ queue.Approval) {
			decide(t, b, id, altered(func(a *queue.Approval) { a.JobID = job.NewID() }))
		}},
		{name: "another tenant's signed answer for a job of the same id", answer: func(t *testing.T, id string, _ queue.Approval) {
			decide(t, b, id, altered(func(a *queue.Approval) { a.Tenant = "team-b" }))
		}},
		{name: "raw KV write claiming a name", answer: func(t *testing.T, id string, p queue.Approval) {
			p.Decision, p.DecidedBy, p.DecidedAt = job.DecisionApproved, "alice", time.Now().UTC()
			rawPut(t, b, id, p)
		}},
		{name: "raw KV write with a signature copied from the request's own denial", answer: func(t *testing.T, id string, p queue.Approval) {
			denied := p
			denied.Decision, denied.DecidedAt = job.DecisionDenied, time.Now().UTC()
			signed, err := asAlice(denied)
			if err != nil {
				t.Fatal(err)
			}
			// The entry says approved; what alice signed says denied.
			p.Decision, p.DecidedBy, p.DecidedAt, p.Signed = job.DecisionApproved, "alice", denied.DecidedAt, signed
			rawPut(t, b, id, p)
		}, deniedBy: "alice"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			j := b.submit("p")
			p := b.waitPending(j.ID)
			tt.answer(t, j.ID, p)
			a := <-answers
			if a.Approved {
				t.Fatalf("the command was approved: %+v", a.Answer)
			}
			switch {
			case tt.deniedBy != "" && (a.By != tt.deniedBy || a.Refused != ""):
				t.Errorf("Approve = %+v; want %s's signed denial", a.Answer, tt.deniedBy)
			case tt.deniedBy == "" && (a.Refused == "" || a.By != ""):
				t.Errorf("Approve = %+v, %v; want a refusal with nobody as the decider", a.Answer, a.err)
			}
			if st := b.waitFinal(j.ID, 10*time.Second); st.State != job.StateSucceeded {
				t.Errorf("final state %s, want succeeded", st.State)
			}
		})
	}
}

// decide answers the job's call_1 through the queue, as submit approve would, signed by sign.
func decide(t *testing.T, b *bundle, id string, sign queue.Signer) {
	t.Helper()
	if _, err := b.q.DecideApproval(context.Background(), id, "call_1", 0, job.DecisionApproved, "alice", "", sign); err != nil {
		t.Fatal(err)
	}
}

// rawPut writes a into the approvals bucket directly, as anyone allowed to write it can.
func rawPut(t *testing.T, b *bundle, id string, a queue.Approval) {
	t.Helper()
	js, err := jetstream.New(b.nc)
	if err != nil {
		t.Fatal(err)
	}
	kv, err := js.KeyValue(context.Background(), queue.ApprovalsBucket(b.cfg.NATS, job.DefaultTenant))
	if err != nil {
		t.Fatal(err)
	}
	data, err := json.Marshal(a)
	if err != nil {
		t.Fatal(err)
	}
	// The key of tenant default's job: tenant.job.call.
	if _, err := kv.Put(context.Background(), "default."+id+".call_1", data); err != nil {
		t.Fatal(err)
	}
}
