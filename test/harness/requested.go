package harness

import (
	"bytes"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
)

// Requested watches, through nc's server, for n requests on subject whose body holds want:
// another client's look-up (a JetStream API call, say) seen from outside, to wait for instead
// of sleeping in the hope that it happened. A client that asks again only once it had its
// answer (a poll) has had the first n-1 answered by the n-th. nc subscribes before Requested
// returns, so every request sent after that is seen; the returned wait blocks until the n-th,
// and fails t after DefaultTimeout (times Scale).
func Requested(t testing.TB, nc *nats.Conn, subject, want string, n int) (wait func()) {
	t.Helper()
	seen := make(chan struct{})
	var mu sync.Mutex
	sub, err := nc.Subscribe(subject, func(m *nats.Msg) {
		if !bytes.Contains(m.Data, []byte(want)) {
			return
		}
		mu.Lock()
		defer mu.Unlock()
		if n--; n == 0 {
			close(seen)
		}
	})
	if err == nil {
		err = nc.Flush() // the server holds the subscription before any request it should see
	}
	if err != nil {
		t.Fatalf("subscribe to %s: %v", subject, err)
	}
	t.Cleanup(func() { _ = sub.Unsubscribe() })
	return func() {
		t.Helper()
		select {
		case <-seen:
		case <-time.After(Timeout(DefaultTimeout)):
			t.Fatalf("no request on %s for %q after %s", subject, want, Timeout(DefaultTimeout))
		}
	}
}
