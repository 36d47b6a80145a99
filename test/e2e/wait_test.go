//go:build integration

package e2e

import (
	"testing"
	"time"
)

// eventually polls cond until it holds, and fails the test after timeout naming what it
// waited for and the last state cond described. Every wait in these tests goes through it;
// timeouts are generous because a busy machine is slow, and nothing asserts how long it took.
// cond may fail the test itself, as when the process it waits on exited.
func eventually(t testing.TB, timeout time.Duration, what string, cond func() (bool, string)) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		ok, state := cond()
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %s; last: %s", what, timeout, state)
		}
		select {
		case <-t.Context().Done():
			t.Fatalf("%s: %v; last: %s", what, t.Context().Err(), state)
		case <-time.After(50 * time.Millisecond):
		}
	}
}
