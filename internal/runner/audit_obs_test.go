package runner_test

import (
	"bufio"
	"context"
	"encoding/json"
	"log/slog"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/boxcar-run/boxcar/internal/agent"
	"github.com/boxcar-run/boxcar/internal/job"
	"github.com/boxcar-run/boxcar/internal/runner"
	"github.com/boxcar-run/boxcar/internal/sandbox"
	testharness "github.com/boxcar-run/boxcar/test/harness"
)

// slowStartProvider is a backend whose sandbox takes long to start (a pod pulling its image):
// Start returns only when its context ends.
type slowStartProvider struct {
	fakeProvider
	starting chan struct{}
}

func (p *slowStartProvider) Start(ctx context.Context, spec sandbox.Spec) (sandbox.Sandbox, error) {
	p.starting <- struct{}{}
	<-ctx.Done()
	return nil, context.Cause(ctx)
}

// TestAuditCancelledStartIsNoSandboxFailure: a user cancels a job while its sandbox starts.
// The backend did nothing wrong, yet boxcar_sandbox_failures_total{stage="start"} counts it,
// and the chart's BoxcarSandboxStartFailures alert (failures over failures plus starts) reads
// cancellations as a failing backend. The same goes for a start cut short by the drain.
func TestAuditCancelledStartIsNoSandboxFailure(t *testing.T) {
	t.Parallel()
	b := setup(t)
	p := &slowStartProvider{starting: make(chan struct{}, 1)}
	w := b.worker(agentFunc(writeReport), func(c *runner.Config) { c.Sandboxes = p })
	j := b.submit("p")
	select {
	case <-p.starting:
	case <-time.After(30 * time.Second):
		t.Fatal("the sandbox never began to start")
	}
	if _, err := b.q.Cancel(context.Background(), j.ID, "tester"); err != nil {
		t.Fatal(err)
	}
	if st := b.waitFinal(j.ID, 20*time.Second); st.State != job.StateCancelled {
		t.Fatalf("the job ended %s: %s, want cancelled", st.State, st.Error)
	}
	w.stop()
	if got := testutil.ToFloat64(w.m.SandboxFailed.WithLabelValues("fake", "start")); got != 0 {
		t.Errorf("boxcar_sandbox_failures_total{backend=\"fake\",stage=\"start\"} = %v after a job cancelled while its sandbox started; want 0 (the backend did not fail)", got)
	}
}

// TestAuditJobLinesNameTheTenant: a job id is a tenant's (two tenants may each have a job
// "x"; the status, cancel and dead-letter keys are tenant.id), so a log line about a job must
// say whose it is, as the runner's own lines do (job_id, tenant, attempt). The agent's lines of
// the job, one per model answer and tool call and the run's end, carry job_id alone: an
// operator cannot tell which tenant's job "x" spent the tokens or ran the command, nor route a
// tenant's lines by the tenant field.
func TestAuditJobLinesNameTheTenant(t *testing.T) {
	t.Parallel()
	b := setup(t)
	body, _ := json.Marshal(map[string]any{
		"id": "chatcmpl-1", "object": "chat.completion", "created": 1, "model": "m",
		"choices": []any{map[string]any{"index": 0, "finish_reason": "stop",
			"message": map[string]any{"role": "assistant", "content": "done"}}},
		"usage": map[string]any{"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
	})
	srv, _ := refusingModel(t, http.StatusOK, string(body))
	var out testharness.LogBuffer
	log := slog.New(slog.NewJSONHandler(&out, &slog.HandlerOptions{Level: slog.LevelDebug}))
	ag, err := agent.New(agent.Config{BaseURL: srv.URL + "/v1", HTTPClient: srv.Client(), MaxRetries: 1, Profiles: b.cfg.Profiles, Logger: log})
	if err != nil {
		t.Fatal(err)
	}
	w := b.worker(ag, func(c *runner.Config) { c.Logger = log })
	j := b.submit("p")
	if st := b.waitFinal(j.ID, 60*time.Second); st.State != job.StateSucceeded {
		t.Fatalf("job %s: %.300s", st.State, st.Error)
	}
	w.stop()
	var lines, without int
	sc := bufio.NewScanner(strings.NewReader(out.String()))
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		var l map[string]any
		if json.Unmarshal(sc.Bytes(), &l) != nil || l["job_id"] != j.ID {
			continue
		}
		lines++
		if _, ok := l["tenant"]; !ok {
			without++
			t.Errorf("a line about job %s names no tenant: %s", j.ID, sc.Bytes())
		}
	}
	if lines == 0 {
		t.Fatal("no line names the job")
	}
	t.Logf("%d of %d lines about the job name no tenant", without, lines)
}
