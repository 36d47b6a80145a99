// Package backoff owns the one wait Boxcar puts between retries of a part that is down (NATS,
// the store, the job stream): 250 ms, doubling each round, up to 5 s. It knows nothing of what
// is retried; its callers count the rounds and stop when their context ends.
package backoff

import "time"

const (
	// First is the wait after the first failed round.
	First = 250 * time.Millisecond
	// Max bounds the wait between two rounds: a part that comes back is found within it.
	Max = 5 * time.Second
)

// Delay is the wait after failed round (1 for the first, as nats.CustomReconnectDelay counts;
// less than 1 counts as 1): First, doubling each round, up to Max.
func Delay(round int) time.Duration {
	return min(First<<min(max(round-1, 0), 5), Max)
}
