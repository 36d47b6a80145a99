package queue_test

import (
	"context"
	"testing"
	"time"
)

// TestApprovalGoesOnAfterAHandover: a redelivered job asking again for a request its earlier
// delivery left pending when it was handed back names that request's revision (Revision, as
// job.Status.Asked records it). The key keeps it, with its own expiry, while it holds that
// revision for the same command; anything else is asked anew.
func TestApprovalGoesOnAfterAHandover(t *testing.T) {
	t.Parallel()
	b := setup(t)
	ctx := context.Background()
	argv := []string{"make", "test"}
	for _, tt := range []struct {
		name string
		// pin is the revision the redelivered job names, given the first request's; argv
		// the command it asks about.
		pin  func(first uint64) uint64
		argv []string
		kept bool
	}{
		{name: "the same request, still pending", pin: func(r uint64) uint64 { return r }, argv: argv, kept: true},
		{name: "another command under the call id", pin: func(r uint64) uint64 { return r }, argv: []string{"make", "deploy"}},
		{name: "a revision the key does not hold", pin: func(r uint64) uint64 { return r + 1000 }, argv: argv},
		{name: "no revision recorded", pin: func(uint64) uint64 { return 0 }, argv: argv},
	} {
		t.Run(tt.name, func(t *testing.T) {
			id := newJob(t).ID
			first, err := b.w.RequestApproval(ctx, pendingApproval(id, "c1", argv, time.Minute))
			if err != nil {
				t.Fatal(err)
			}
			again := pendingApproval(id, "c1", tt.argv, time.Hour)
			again.Attempt, again.Revision = 2, tt.pin(first.Revision)
			got, err := b.w.RequestApproval(ctx, again)
			switch {
			case err != nil || got.Decision != "":
				t.Fatalf("asking again = %+v, %v; want a pending request", got, err)
			case tt.kept && (got.Revision != first.Revision || !got.ExpiresAt.Equal(first.ExpiresAt) || got.Attempt != 1):
				t.Errorf("asking again = revision %d, expiring %s, attempt %d; want the first request kept (revision %d, %s)",
					got.Revision, got.ExpiresAt, got.Attempt, first.Revision, first.ExpiresAt)
			case !tt.kept && (got.Revision == first.Revision || !got.ExpiresAt.Equal(again.ExpiresAt)):
				t.Errorf("asking again = revision %d, expiring %s; want a new request", got.Revision, got.ExpiresAt)
			}
		})
	}
}
