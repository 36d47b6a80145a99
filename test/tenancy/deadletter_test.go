//go:build integration

package tenancy

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/boxcar-run/boxcar/internal/queue"
)

// TestSubmitterReadsItsDeadLettersFromSetUpsLayout: a submitter may read its tenant's dead
// letters from the layout `worker setup` makes, not only from one the test makes itself: in its
// tenant's stream, and by their subjects (a direct get with the subject in the request's own
// subject, the only form its identity is granted) those in the shared stream an older worker
// wrote; and so may the worker. Setup made the stream without direct gets, so the server
// answered the granted form with nothing and the submitter could not read its letters at all.
// Another tenant's letters it may not read, in either.
func TestSubmitterReadsItsDeadLettersFromSetUpsLayout(t *testing.T) {
	t.Parallel()
	d := deploy(t)
	cfg := setUp(t, d)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	const own, older = "20261204t140000-000000000000", "20261204t140000-000000000001"
	w := d.connect(t, "worker")
	for _, subject := range []string{
		queue.DeadLetterStream(cfg, "team-a") + "." + own, queue.DeadLetterStream(cfg, "team-b") + "." + own,
		cfg.DeadLetterStream + ".team-a." + older, cfg.DeadLetterStream + ".team-b." + older,
	} {
		if _, err := w.js.Publish(ctx, subject, []byte(`{"reason":"exhausted"}`)); err != nil {
			t.Fatalf("the worker dead-letters %s: %v", subject, err)
		}
	}
	// The worker reads a letter back when its publish got no answer, to count it once.
	for _, who := range []string{"team-a-submitter", "worker"} {
		c := d.connect(t, who)
		for _, id := range []string{own, older} {
			read, cancel := context.WithTimeout(ctx, 20*time.Second) // unanswered, it waits to the end
			data, err := queue.DeadLetterOf(read, c.nc, cfg, queue.Ref{Tenant: "team-a", ID: id})
			cancel()
			if err != nil {
				t.Errorf("%s reads team-a's dead letter %s: %v", who, id, err)
			} else if string(data) != `{"reason":"exhausted"}` {
				t.Errorf("%s reads team-a's dead letter %s as %q", who, id, data)
			}
		}
	}
	for _, id := range []string{own, older} {
		sa := d.connect(t, "team-a-submitter") // its own: a refusal ends what waits on the connection
		data, err := queue.DeadLetterOf(ctx, sa.nc, cfg, queue.Ref{Tenant: "team-b", ID: id})
		if !errors.Is(err, jetstream.ErrMsgNotFound) || data != nil { // refused: none it may read
			t.Errorf("team-a's submitter reads team-b's dead letter %s: %q, %v; want it refused", id, data, err)
		}
	}
}
