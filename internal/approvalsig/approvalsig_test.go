package approvalsig_test

import (
	"cmp"
	"crypto/ed25519"
	"errors"
	"testing"
	"time"

	"github.com/boxcar-run/boxcar/internal/approvalsig"
	"github.com/boxcar-run/boxcar/internal/job"
	"github.com/boxcar-run/boxcar/internal/provenance"
)

func TestCheck(t *testing.T) {
	t.Parallel()
	_, alice, _ := ed25519.GenerateKey(nil)
	_, mallory, _ := ed25519.GenerateKey(nil)
	now := time.Now().UTC()
	_, bob, _ := ed25519.GenerateKey(nil)
	// carol approves team-a's commands and dave team-b's; alice and bob every tenant's.
	_, carol, _ := ed25519.GenerateKey(nil)
	_, dave, _ := ed25519.GenerateKey(nil)
	ring := provenance.Keyring{{Name: "alice", Key: alice.Public().(ed25519.PublicKey), NotBefore: now.Add(-time.Hour)},
		{Name: "bob", Key: bob.Public().(ed25519.PublicKey), NotAfter: now.Add(-5 * time.Minute)},
		{Name: "carol", Key: carol.Public().(ed25519.PublicKey), Tenants: []string{"team-a"}},
		{Name: "dave", Key: dave.Public().(ed25519.PublicKey), Tenants: []string{"team-c", "team-b"}}}
	req := approvalsig.Request{Tenant: "team-b", JobID: job.NewID(), CallID: "call_1", Argv: []string{"make", "test"}, Revision: 7, ExpiresAt: now.Add(time.Minute)}
	good := approvalsig.Statement{Tenant: "team-b", JobID: req.JobID, CallID: "call_1", ArgvSHA256: approvalsig.ArgvDigest(req.Argv), RequestRevision: 7,
		Decision: job.DecisionApproved, DecidedAt: now, ExpiresAt: req.ExpiresAt}
	tests := []struct {
		name   string
		change func(*approvalsig.Statement)
		key    ed25519.PrivateKey
		raw    string // sent as it is instead of a signed statement
		asked  func(*approvalsig.Request)
		want   error
		signer string // the key Check names; alice when empty
	}{
		{name: "good", key: alice},
		{name: "unsigned", raw: "", want: approvalsig.ErrUnsigned},
		{name: "not an envelope", raw: `{"decision":"approved"}`, want: approvalsig.ErrBadSignature},
		{name: "wrong key", key: mallory, want: approvalsig.ErrBadSignature},
		{name: "replayed revision", key: alice, change: func(s *approvalsig.Statement) { s.RequestRevision = 6 }, want: approvalsig.ErrMismatch},
		// A request whose revision the worker does not know (never recorded, or forgotten) is
		// answered by nothing: any answer to any copy of it would do otherwise.
		{name: "request of no known revision", key: alice, asked: func(r *approvalsig.Request) { r.Revision = 0 }, want: approvalsig.ErrMismatch},
		{name: "statement of no revision", key: alice, change: func(s *approvalsig.Statement) { s.RequestRevision = 0 }, asked: func(r *approvalsig.Request) { r.Revision = 0 }, want: approvalsig.ErrMismatch},
		{name: "other argv", key: alice, change: func(s *approvalsig.Statement) { s.ArgvSHA256 = approvalsig.ArgvDigest([]string{"make", "test "}) }, want: approvalsig.ErrMismatch},
		{name: "another tenant's job of the same id", key: alice, change: func(s *approvalsig.Statement) { s.Tenant = "team-a" }, want: approvalsig.ErrMismatch},
		{name: "other job", key: alice, change: func(s *approvalsig.Statement) { s.JobID = job.NewID() }, want: approvalsig.ErrMismatch},
		{name: "other call", key: alice, change: func(s *approvalsig.Statement) { s.CallID = "call_2" }, want: approvalsig.ErrMismatch},
		{name: "unknown decision", key: alice, change: func(s *approvalsig.Statement) { s.Decision = job.DecisionExpired }, want: approvalsig.ErrMismatch},
		{name: "after expiry", key: alice, change: func(s *approvalsig.Statement) { s.DecidedAt = s.ExpiresAt.Add(job.ClockSkew + time.Second) }, want: approvalsig.ErrExpired},
		// The answerer's clock 5 minutes ahead of the worker's, which set the expiry a minute
		// out: the worker still waits, and the answer is its.
		{name: "answerer's clock ahead", key: alice, change: func(s *approvalsig.Statement) { s.DecidedAt = now.Add(5 * time.Minute) }},
		{name: "before the key was valid", key: alice, change: func(s *approvalsig.Statement) { s.DecidedAt = now.Add(-2 * time.Hour) }, want: approvalsig.ErrKeyOutsideDates},
		// A key's dates are judged on the answerer's clock, which may be job.ClockSkew off.
		{name: "answerer's clock behind at the key's start", key: alice, change: func(s *approvalsig.Statement) { s.DecidedAt = now.Add(-time.Hour - job.ClockSkew + time.Second) }},
		{name: "answerer's clock ahead at the key's end", key: bob, signer: "bob"},
		// Another tenant's approver signs this tenant's request, which only a writer of this
		// tenant's approvals (whom the worker does not trust to approve) can put there.
		{name: "another tenant's approver", key: carol, want: approvalsig.ErrKeyNotForTenant},
		{name: "this tenant's approver", key: dave, signer: "dave"},
		{name: "after the key was retired", key: bob, change: func(s *approvalsig.Statement) { s.DecidedAt = now.Add(-5*time.Minute + job.ClockSkew + time.Second) }, want: approvalsig.ErrKeyOutsideDates},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			signed := tt.raw
			if tt.key != nil {
				s := good
				if tt.change != nil {
					tt.change(&s)
				}
				var err error
				if signed, err = approvalsig.Sign(s, tt.key); err != nil {
					t.Fatal(err)
				}
			}
			asked := req
			if tt.asked != nil {
				tt.asked(&asked)
			}
			_, key, err := approvalsig.Check(signed, asked, ring)
			switch {
			case tt.want == nil && (err != nil || key.Name != cmp.Or(tt.signer, "alice")):
				t.Fatalf("Check = %q, %v; want %s", key.Name, err, cmp.Or(tt.signer, "alice"))
			case tt.want != nil && !errors.Is(err, tt.want):
				t.Fatalf("Check: %v; want %v", err, tt.want)
			}
		})
	}
}
