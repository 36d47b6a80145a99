package runner_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/boxcar-run/boxcar/internal/agent"
	"github.com/boxcar-run/boxcar/internal/config"
	"github.com/boxcar-run/boxcar/internal/demomodel"
	"github.com/boxcar-run/boxcar/internal/job"
	"github.com/boxcar-run/boxcar/internal/metrics"
	"github.com/boxcar-run/boxcar/internal/modelgate"
	"github.com/boxcar-run/boxcar/internal/runner"
)

// stoppable is the scripted demo model behind a switch: while down it answers nothing (the
// connection is closed, as a stopped process's would be refused), probes included.
type stoppable struct {
	srv    *httptest.Server
	down   atomic.Bool
	probes atomic.Int64 // GET /v1/models while down
}

func newStoppable(t *testing.T) *stoppable {
	s := &stoppable{}
	model := demomodel.Handler()
	s.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !s.down.Load() {
			model.ServeHTTP(w, r)
			return
		}
		if r.URL.Path == "/v1/models" {
			s.probes.Add(1)
		}
		if c, _, err := w.(http.Hijacker).Hijack(); err == nil {
			c.Close()
		}
	}))
	t.Cleanup(s.srv.Close)
	return s
}

// demoProfile is played by the demo model: list_files, then an answer (it needs csv_stats to
// go on, which the profile does not offer).
const demoProfile = `
profiles:
  d:
    model: {name: boxcar-demo}
    tools: [{name: list_files}, {name: read_file}]
`

// TestModelOutageKillsNoJob: with the model stopped, the job in flight waits without spending
// a delivery or a turn, the worker fetches no other job, boxcar_model_up reads 0; when the
// model is back every job commits at its first delivery with the turns of a run without the
// outage.
func TestModelOutageKillsNoJob(t *testing.T) {
	t.Parallel()
	b := setup(t)
	extra, err := config.Parse([]byte(demoProfile))
	if err != nil {
		t.Fatal(err)
	}
	b.cfg.Profiles["d"] = extra.Profiles["d"]
	b.cfg.Concurrency = 3
	model := newStoppable(t)
	m := metrics.New()
	gate, err := modelgate.New(modelgate.Config{Threshold: 2, MinBackoff: 20 * time.Millisecond, MaxBackoff: 100 * time.Millisecond,
		OnChange: m.SetModelUp, Probe: func(ctx context.Context) (*http.Response, error) {
			req, _ := http.NewRequestWithContext(ctx, http.MethodGet, model.srv.URL+"/v1/models", nil)
			return model.srv.Client().Do(req)
		}})
	if err != nil {
		t.Fatal(err)
	}
	ag, err := agent.New(agent.Config{BaseURL: model.srv.URL + "/v1", HTTPClient: model.srv.Client(), MaxRetries: 1,
		Gate: gate, Profiles: b.cfg.Profiles})
	if err != nil {
		t.Fatal(err)
	}
	w := b.worker(ag, func(c *runner.Config) { c.Metrics, c.ModelGate = m, gate })

	// The same job without an outage: what it spends.
	base := b.waitFinal(b.submit("d").ID, 30*time.Second)
	if base.State != job.StateSucceeded || base.SpentTurns == 0 {
		t.Fatalf("without an outage: %s, %d turns: %s", base.State, base.SpentTurns, base.Error)
	}

	model.down.Store(true)
	first := b.submit("d")
	waitFor(t, 30*time.Second, "boxcar_model_up to read 0", func() bool { return testutil.ToFloat64(m.ModelUp) == 0 })
	ids := []string{first.ID}
	for range 4 {
		ids = append(ids, b.submit("d").ID)
	}
	// The fetch that was waiting for a job when the gate opened (if it had begun) takes one;
	// then a slot is free and jobs are queued, and while probes keep failing none is fetched.
	probed := model.probes.Load()
	waitFor(t, 30*time.Second, "five more failed probes", func() bool { return model.probes.Load() >= probed+5 })
	if n := w.p.started.Load(); n > 3 {
		t.Fatalf("%d sandboxes started, want at most 3 (the job before the outage, the one that met it, the one a waiting fetch took): jobs were fetched while the model was down", n)
	}
	if testutil.ToFloat64(m.ModelUp) != 0 || gate.Err() == nil {
		t.Fatalf("model_up %v, gate %v while the model is down", testutil.ToFloat64(m.ModelUp), gate.Err())
	}

	model.down.Store(false)
	for _, id := range ids {
		st := b.waitFinal(id, time.Minute)
		if st.State != job.StateSucceeded || st.Attempt != 1 || st.SpentTurns != base.SpentTurns {
			t.Errorf("job %s: %s at attempt %d, %d turns; want succeeded at attempt 1 with %d turns as without the outage: %s",
				id, st.State, st.Attempt, st.SpentTurns, base.SpentTurns, st.Error)
		}
	}
	if dl := b.settledLetters(); len(dl) != 0 {
		t.Errorf("%d dead letters, want none", len(dl))
	}
	if n := w.p.started.Load(); n != int64(len(ids)+1) {
		t.Errorf("%d sandboxes started for %d jobs: a job ran more than once", n, len(ids)+1)
	}
	if got := testutil.ToFloat64(m.ModelUp); got != 1 {
		t.Errorf("boxcar_model_up = %v after the model came back, want 1", got)
	}
}
