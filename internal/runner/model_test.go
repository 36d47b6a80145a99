package runner_test

import (
	"context"
	"github.com/boxcar-run/boxcar/internal/config"
	"github.com/boxcar-run/boxcar/internal/demomodel"
	"github.com/boxcar-run/boxcar/internal/provenance"
	"github.com/boxcar-run/boxcar/internal/store"

	"encoding/json"
	"github.com/boxcar-run/boxcar/internal/modelgate"
	"github.com/boxcar-run/boxcar/internal/runner"
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
// max_payload, and the job is never recorded failed: the run is committed (failed), but the
// status write and the dead letter (which carries the same error) fail with "nats: maximum
// payload exceeded", the end is "undecided" and the job is nak'd, delivered again past
// max_deliver, each delivery holding a slot up to twice job_timeout waiting for NATS, without
// end (seen with job_timeout 3s over 25s: attempts 1-4, status running throughout).
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

// TestAuditModelLongRetryAfterSpendsNoDelivery: an endpoint that answers 503 or 429 with a
// Retry-After longer than the client honours (openai-go's 2 minutes: a maintenance window, an
// hourly quota) is an endpoint that is down for that long. docs/operations.md (BoxcarModelDown):
// "answers 5xx or 429 persistently. The workers take no new jobs, hold the ones in flight
// without spending deliveries or turns". Found: openai-go returns such an answer at its first
// attempt without retrying, so one chat request is one failure of the breaker's three; the gate
// is still up, the run ends ErrModelUnavailable and the job is handed back: every delivery
// but the one that finally opens the breaker is spent, within seconds.
func TestAuditModelLongRetryAfterSpendsNoDelivery(t *testing.T) {
	t.Parallel()
	for _, status := range []int{http.StatusServiceUnavailable, http.StatusTooManyRequests} {
		t.Run(http.StatusText(status), func(t *testing.T) {
			t.Parallel()
			b := setup(t)
			var chats atomic.Int64
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				_, _ = io.Copy(io.Discard, r.Body)
				w.Header().Set("Content-Type", "application/json")
				if r.URL.Path == "/v1/models" {
					_, _ = io.WriteString(w, `{"object":"list","data":[]}`)
					return
				}
				chats.Add(1)
				w.Header().Set("Retry-After", "600")
				w.WriteHeader(status)
				_, _ = io.WriteString(w, `{"error":{"message":"come back in ten minutes","type":"server_error","code":null}}`)
			}))
			t.Cleanup(srv.Close)
			gate, err := modelgate.New(modelgate.Config{Probe: func(ctx context.Context) (*http.Response, error) {
				req, _ := http.NewRequestWithContext(ctx, http.MethodGet, srv.URL+"/v1/models", nil)
				return srv.Client().Do(req)
			}})
			if err != nil {
				t.Fatal(err)
			}
			// The worker's defaults: max_retries 3, the gate's threshold 3.
			ag, err := agent.New(agent.Config{BaseURL: srv.URL + "/v1", HTTPClient: srv.Client(), MaxRetries: 3,
				Gate: gate, Profiles: b.cfg.Profiles})
			if err != nil {
				t.Fatal(err)
			}
			b.worker(ag, func(c *runner.Config) { c.ModelGate = gate })
			j := b.submit("p")
			waitFor(t, 30*time.Second, "the breaker to open", func() bool { return !gate.Up() })
			time.Sleep(time.Second) // any hand-back in flight is recorded
			st, err := b.q.Status(context.Background(), j.ID)
			if err != nil {
				t.Fatal(err)
			}
			if st.Attempt != 1 {
				t.Errorf("the job is at delivery %d of max_deliver 3 (state %s, %d chat requests) while the endpoint asks to wait; want it held at delivery 1: %s",
					st.Attempt, st.State, chats.Load(), st.Error)
			}
		})
	}
}

// TestAuditModelAnswerFieldsBoundedInManifest: what the endpoint says about its answer (the
// response id, the model name) goes into the signed manifest as sent: the agent bounds the
// tool call ids and names a hostile or broken endpoint sends, not these. One answer whose id
// is 9 MiB (within the agent's 16 MiB bound on an answer) commits a run whose manifest records
// it twice (model.response_ids and usage's calls): 18 MiB, past the 16 MiB that
// provenance.Verify, `submit get/verify/logs/gc` and the worker's own adoptCommitted read, so
// the job succeeds and its run can never be verified.
func TestAuditModelAnswerFieldsBoundedInManifest(t *testing.T) {
	t.Parallel()
	b := setup(t)
	body, _ := json.Marshal(map[string]any{
		"id": "chatcmpl-" + strings.Repeat("i", 9<<20), "object": "chat.completion", "created": 1, "model": "m",
		"choices": []any{map[string]any{"index": 0, "finish_reason": "stop",
			"message": map[string]any{"role": "assistant", "content": "done"}}},
		"usage": map[string]any{"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
	})
	srv, _ := refusingModel(t, http.StatusOK, string(body))
	ag, err := agent.New(agent.Config{BaseURL: srv.URL + "/v1", HTTPClient: srv.Client(), MaxRetries: 1, Profiles: b.cfg.Profiles})
	if err != nil {
		t.Fatal(err)
	}
	b.worker(ag)
	j := b.submit("p")
	st := b.waitFinal(j.ID, 60*time.Second)
	if st.State != job.StateSucceeded {
		t.Fatalf("job %s: %.300s", st.State, st.Error)
	}
	if n := len(b.object(store.ManifestKey(j.ID))); n > 1<<20 {
		t.Errorf("the manifest is %d MiB", n>>20)
	}
	if report, err := provenance.Verify(t.Context(), b.store, j.ID, nil); err != nil || !report.OK() {
		t.Errorf("the committed run does not verify: %v", err)
	}
}

// TestAuditModelUnavailableTurnNotSpent: "a request the endpoint was unavailable for is not
// counted as a turn" (docs/lifecycle.md; agent.Budget). The agent keeps to it in its Result,
// but the progress event it sends before each request has already counted the turn, and the
// runner's budget only ever adds: a delivery whose request met the endpoint unavailable (a 503
// the client gave up on, the breaker still closed) leaves a turn spent in the job's status,
// and the next delivery starts with one turn less. Here the model's first chat request meets
// a 503 with a long Retry-After; the job then runs as the demo model plays it.
func TestAuditModelUnavailableTurnNotSpent(t *testing.T) {
	t.Parallel()
	b := setup(t)
	extra, err := config.Parse([]byte(demoProfile))
	if err != nil {
		t.Fatal(err)
	}
	b.cfg.Profiles["d"] = extra.Profiles["d"]
	var fail atomic.Bool
	model := demomodel.Handler()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/v1/chat/completions" && fail.CompareAndSwap(true, false) {
			_, _ = io.Copy(io.Discard, r.Body)
			w.Header().Set("Content-Type", "application/json")
			w.Header().Set("Retry-After", "600")
			w.WriteHeader(http.StatusServiceUnavailable)
			_, _ = io.WriteString(w, `{"error":{"message":"maintenance","type":"server_error","code":null}}`)
			return
		}
		model.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	ag, err := agent.New(agent.Config{BaseURL: srv.URL + "/v1", HTTPClient: srv.Client(), MaxRetries: 3, Profiles: b.cfg.Profiles})
	if err != nil {
		t.Fatal(err)
	}
	b.worker(ag)
	base := b.waitFinal(b.submit("d").ID, 30*time.Second)
	if base.State != job.StateSucceeded {
		t.Fatalf("without a failure: %s: %s", base.State, base.Error)
	}
	fail.Store(true)
	st := b.waitFinal(b.submit("d").ID, 30*time.Second)
	if st.State != job.StateSucceeded || st.Attempt != 2 {
		t.Fatalf("with a 503 first: %s at attempt %d, want succeeded at attempt 2: %s", st.State, st.Attempt, st.Error)
	}
	if st.SpentTurns != base.SpentTurns {
		t.Errorf("spent %d turns, want %d as without the 503: the request the endpoint was unavailable for counted as a turn", st.SpentTurns, base.SpentTurns)
	}
}
