package runner_test

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/boxcar-run/boxcar/internal/agent"
	"github.com/boxcar-run/boxcar/internal/job"
)

// refusingModel answers every chat request with status and body, and counts them.
func refusingModel(t *testing.T, status int, body string) (*httptest.Server, *atomic.Int64) {
	t.Helper()
	var n atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		n.Add(1)
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(status)
		_, _ = io.WriteString(w, body)
	}))
	t.Cleanup(srv.Close)
	return srv, &n
}

// TestAuditModelPermanentRefusalEndsTheJob: an endpoint that refuses the key ends the job
// failed at its first attempt with model_rejected (docs/lifecycle.md: "failed: a permanent
// fault (e.g. the model rejected the key ...)"), whatever the shape of its error body, and an
// error of megabytes from the endpoint does not keep the job from ending.
//
// Found: a 401 whose body says {"error":"..."} (a string, as TGI, LM Studio and many proxies
// answer) is taken for an unreachable endpoint and retried at every delivery; a 401 whose
// error code is 1.5 MiB goes into the job's status and dead letter whole, past NATS's
// max_payload, and the job is never recorded failed.
func TestAuditModelPermanentRefusalEndsTheJob(t *testing.T) {
	t.Parallel()
	bigCode, _ := json.Marshal(map[string]any{"error": map[string]any{
		"message": "Incorrect API key provided", "type": "invalid_request_error", "code": strings.Repeat("k", 3<<19)}})
	tests := []struct {
		name string
		body string
	}{
		{name: "string error", body: `{"error":"Invalid API key"}`},
		{name: "code of 1.5 MiB", body: string(bigCode)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			srv, requests := refusingModel(t, http.StatusUnauthorized, tt.body)
			ag, err := agent.New(agent.Config{BaseURL: srv.URL + "/v1", HTTPClient: srv.Client(), APIKey: "sk-audit-model",
				MaxRetries: 1, Profiles: b.cfg.Profiles})
			if err != nil {
				t.Fatal(err)
			}
			b.worker(ag)
			j := b.submit("p")
			st := b.waitFinal(j.ID, 45*time.Second)
			if st.State != job.StateFailed || st.Attempt != 1 {
				t.Errorf("job %s at attempt %d after %d model requests; want failed at attempt 1: %.300s",
					st.State, st.Attempt, requests.Load(), st.Error)
			}
			if len(st.Error) > 16<<10 {
				t.Errorf("the status's error is %d bytes", len(st.Error))
			}
			dls := b.deadLetters()
			if len(dls) != 1 || dls[0].Reason != "model_rejected" {
				reasons := make([]string, len(dls))
				for i, dl := range dls {
					reasons[i] = dl.Reason
				}
				t.Errorf("dead letters %v, want one with reason model_rejected", reasons)
			}
		})
	}
}
