package egress

import (
	"fmt"
	"testing"
	"time"
)

// TestLeafCacheIsBounded: a secret bound to a wildcard terminates TLS for every name under it,
// and the job chooses the names: each CONNECT to a new one signed a leaf that the job's CA kept
// until the job ended, as many as max_requests (10,000 by default) let it make. The cache
// keeps at most maxLeaves, and a name asked for again while cached gets the same leaf.
func TestLeafCacheIsBounded(t *testing.T) {
	t.Parallel()
	a, err := newAuthority(time.Hour, []string{"files.example.com"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	first, err := a.leaf("a.files.example.com")
	if err != nil {
		t.Fatal(err)
	}
	if again, _ := a.leaf("a.files.example.com"); again != first {
		t.Error("a cached name got a new leaf")
	}
	for i := range 4 * maxLeaves {
		if _, err := a.leaf(fmt.Sprintf("n%d.files.example.com", i)); err != nil {
			t.Fatal(err)
		}
	}
	a.mu.Lock()
	n := len(a.leaves)
	a.mu.Unlock()
	if n > maxLeaves {
		t.Errorf("the CA keeps %d leaves after %d names; want at most %d", n, 4*maxLeaves+1, maxLeaves)
	}
	last := fmt.Sprintf("n%d.files.example.com", 4*maxLeaves-1)
	c1, _ := a.leaf(last)
	c2, _ := a.leaf(last)
	if c1 != c2 {
		t.Error("the name signed last got a new leaf the next time")
	}
}
