package runner_test

import (
	"context"
	"fmt"
	"io"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/boxcar-run/boxcar/internal/agent"
	"github.com/boxcar-run/boxcar/internal/job"
	"github.com/boxcar-run/boxcar/internal/provenance"
	"github.com/boxcar-run/boxcar/internal/runner"
	"github.com/boxcar-run/boxcar/internal/store"
)

// heldManifestStore takes the run's manifest put and then holds its answer until the put's
// context ends, as a store whose answer is still on its way when the worker shuts down.
type heldManifestStore struct {
	store.Store
	once sync.Once
	held chan struct{} // closed once the manifest is stored and its answer held
}

func (s *heldManifestStore) PutIfAbsent(ctx context.Context, key string, r io.Reader, size int64) error {
	if !strings.HasSuffix(key, "/manifest.json") || strings.Contains(key, "/attempts/") {
		return s.Store.PutIfAbsent(ctx, key, r, size)
	}
	if err := s.Store.PutIfAbsent(ctx, key, r, size); err != nil {
		return err
	}
	s.once.Do(func() { close(s.held) })
	<-ctx.Done()
	return fmt.Errorf("store: put-if-absent %s: %w", key, ctx.Err())
}

// TestShutdownWhileTheManifestsAnswerIsOnItsWay: the drain grace runs out after the store took
// the run's manifest and before its answer came back, so the worker cannot tell whether the run
// committed (store.ErrMaybeStored) and the commit gives up. The job is handed back, not ended,
// and the next delivery finds the run committed: it ends the job as the manifest says (attempt
// 1, succeeded) without running it again, and restores the signature the first worker never
// put into place, so the run verifies and nothing of it is left unnamed or removed.
func TestShutdownWhileTheManifestsAnswerIsOnItsWay(t *testing.T) {
	t.Parallel()
	b := setup(t)
	b.setAckWait(30 * time.Second) // redelivery must not wait for this
	priv, pub := signingKeys(t)
	var ran atomic.Int64
	counted := agentFunc(func(ctx context.Context, req agent.Request) (agent.Result, error) {
		ran.Add(1)
		return writeReport(ctx, req)
	})
	held := &heldManifestStore{Store: b.shared, held: make(chan struct{})}
	first := b.worker(counted, func(c *runner.Config) { c.Store, c.SigningKey = held, priv })
	j := b.submit("p")
	select {
	case <-held.held:
	case <-time.After(30 * time.Second):
		t.Fatal("the manifest was never put")
	}
	first.stop() // drain_grace is 1s, then the commit is cut short
	if st, _ := b.q.Status(context.Background(), j.ID); st.State.Terminal() {
		t.Errorf("status after a shutdown with the commit unsettled = %s (%s); want the job handed back", st.State, st.Error)
	}
	b.worker(counted, func(c *runner.Config) { c.SigningKey = priv })
	st := b.waitFinal(j.ID, 20*time.Second)
	if st.State != job.StateSucceeded || st.Attempt != 1 {
		t.Errorf("status = %s on attempt %d (%s), want succeeded on attempt 1, the committed run's", st.State, st.Attempt, st.Error)
	}
	if n := ran.Load(); n != 1 {
		t.Errorf("the job ran %d times, want once: the next delivery adopts the committed run", n)
	}
	report, err := provenance.Verify(context.Background(), b.store, j.ID, pub)
	if err != nil || !report.OK() {
		t.Fatalf("verify: %v %+v", err, report.Checks)
	}
	if unlisted, err := provenance.Unlisted(context.Background(), b.store, j.ID, report.Statement); err != nil || len(unlisted) != 0 {
		t.Errorf("objects the manifest does not name: %q, %v; want none", unlisted, err)
	}
}
