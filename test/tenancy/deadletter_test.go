//go:build integration

package tenancy

import (
	"context"
	"testing"
	"time"
)

// TestSubmitterReadsItsDeadLettersFromSetUpsLayout: a submitter may read its tenant's dead
// letters (a direct get with the subject in the request's own subject, the only form its
// identity is granted) from the dead-letter stream `worker setup` makes, not only from one the
// test makes itself; and so may the worker. Setup made the stream without direct gets, so the server answered the
// granted form with nothing and the submitter could not read its letters at all.
func TestSubmitterReadsItsDeadLettersFromSetUpsLayout(t *testing.T) {
	t.Parallel()
	d := deploy(t)
	cfg := setUp(t, d)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	subject := cfg.DeadLetterStream + ".team-a.20261204t140000-000000000000"
	if _, err := d.connect(t, "worker").js.Publish(ctx, subject, []byte(`{"reason":"exhausted"}`)); err != nil {
		t.Fatalf("the worker dead-letters team-a's job: %v", err)
	}
	// The worker reads a letter back when its publish got no answer, to count it once.
	for _, who := range []string{"team-a-submitter", "worker"} {
		s, err := d.connect(t, who).js.Stream(ctx, cfg.DeadLetterStream)
		if err != nil {
			t.Fatalf("%s looks up %s: %v", who, cfg.DeadLetterStream, err)
		}
		read, cancel := context.WithTimeout(ctx, 20*time.Second) // unanswered, it waits to the end
		m, err := s.GetLastMsgForSubject(read, subject)
		cancel()
		if err != nil {
			t.Errorf("%s reads team-a's dead letter: %v", who, err)
		} else if string(m.Data) != `{"reason":"exhausted"}` {
			t.Errorf("%s reads team-a's dead letter as %q", who, m.Data)
		}
	}
}
