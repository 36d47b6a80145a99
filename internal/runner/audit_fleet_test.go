package runner_test

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/boxcar-run/boxcar/internal/config"
	"github.com/boxcar-run/boxcar/internal/job"
	"github.com/boxcar-run/boxcar/internal/queue"
	"github.com/boxcar-run/boxcar/internal/runner"
)

// A fleet mid-rollout: worker "new" defines profiles p and q (its config was upgraded), worker
// "old" defines p only. `submit run --profile q` checks the live workers' profiles and lets the
// job through (worker "new" publishes q). If the job's delivery reaches worker "old", it is not
// a fault of the job: a live peer defines q. It should be left to that peer (handed back), not
// rejected for good as unknown_profile.
func TestAuditFleetProfileOfALivePeerIsNotRejected(t *testing.T) {
	t.Parallel()
	b := setup(t)

	newCfg, err := config.Parse([]byte(profiles + `
  q:
    model: {name: m}
    tools: [{name: read_file}]
`))
	if err != nil {
		t.Fatal(err)
	}
	// Worker "new" is live: it publishes its profiles, as every worker does from its start.
	_, peer := b.connect()
	ctx, cancel := context.WithCancel(context.Background())
	advertised := make(chan struct{})
	go func() {
		defer close(advertised)
		_ = peer.AdvertiseProfiles(ctx, "worker-new", newCfg.Profiles, newCfg.TenantsOrDefault())
	}()
	t.Cleanup(func() { cancel(); <-advertised })
	waitFor(t, 10*time.Second, "worker-new's profiles published", func() bool {
		live, err := b.q.LiveProfiles(context.Background())
		return err == nil && len(live) == 1
	})

	// Worker "old" (profile p only) takes the job of profile q.
	old := b.worker(agentFunc(writeReport), func(c *runner.Config) { c.Worker.WorkerID = "worker-old" })
	j := b.submit("q")
	waitFor(t, 20*time.Second, "worker-old to settle its delivery", func() bool {
		st, err := b.q.Status(context.Background(), j.ID)
		return err == nil && st.State != job.StateRunning && st.State != ""
	})
	old.stop()
	st, _ := b.q.Status(context.Background(), j.ID)
	t.Logf("after worker-old: state %s, error %q", st.State, st.Error)

	// Worker "new" comes up and would run it.
	cancel()
	<-advertised
	b.cfg = newCfg
	b.worker(agentFunc(writeReport), func(c *runner.Config) {
		c.Worker.WorkerID = "worker-new"
		c.Logger = slog.New(slog.DiscardHandler)
	})
	final := b.waitFinal(j.ID, 30*time.Second)
	if final.State != job.StateSucceeded {
		t.Errorf("job of profile q, which live worker-new defines, ended %s (%s) on worker-old, which lacks q; dead letters: %v; want it left to worker-new and succeeded",
			final.State, final.Error, reasons(b.deadLetters()))
	}
}

func reasons(dls []queue.DeadLetter) []string {
	var out []string
	for _, d := range dls {
		out = append(out, d.Reason)
	}
	return out
}
