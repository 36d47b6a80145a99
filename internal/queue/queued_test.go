package queue_test

import (
	"testing"

	"github.com/nats-io/nats.go"
)

// TestQueuedIsOneRequest: Consumer.Queued, which a worker's cancel watch asks for each request
// whose job has no status, is one request to the server: the count of the job's subject in its
// tenant's stream, through the stream's handle the worker bound. Before, a look-up of the
// stream (STREAM.INFO with no filter) came first, two round trips for each request.
func TestQueuedIsOneRequest(t *testing.T) {
	t.Parallel()
	b := setup(t)
	j := b.submit(t)
	ch := make(chan *nats.Msg, 16)
	sub, err := b.nc.ChanSubscribe("$JS.API.STREAM.INFO.>", ch)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sub.Unsubscribe() })
	for _, tt := range []struct {
		id   string
		want bool
	}{{j.ID, true}, {newJob(t).ID, false}} {
		queued, err := b.w.Queued(t.Context(), ref(tt.id))
		if err != nil || queued != tt.want {
			t.Fatalf("Queued(%s) = %v, %v; want %v", tt.id, queued, err, tt.want)
		}
		if err := b.nc.Flush(); err != nil {
			t.Fatal(err)
		}
		if n := len(ch); n != 1 {
			t.Errorf("Queued(%s) sent %d stream info requests; want 1", tt.id, n)
		}
		for len(ch) > 0 {
			<-ch
		}
	}
}
