package runner_test

import (
	"bufio"
	"encoding/json"
	"log/slog"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/boxcar-run/boxcar/internal/agent"
	"github.com/boxcar-run/boxcar/internal/job"
	"github.com/boxcar-run/boxcar/internal/runner"
	testharness "github.com/boxcar-run/boxcar/test/harness"
)

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
