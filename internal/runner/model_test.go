package runner_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/boxcar-run/boxcar/internal/agent"
	"github.com/boxcar-run/boxcar/internal/config"
	"github.com/boxcar-run/boxcar/internal/demomodel"
	"github.com/boxcar-run/boxcar/internal/job"
	"github.com/boxcar-run/boxcar/internal/modelgate"
	"github.com/boxcar-run/boxcar/internal/provenance"
	"github.com/boxcar-run/boxcar/internal/runner"
	"github.com/boxcar-run/boxcar/internal/store"
	testharness "github.com/boxcar-run/boxcar/test/harness"
)

// What a job makes of its model endpoint's answers, through the real agent and openai-go.

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

// TestModelRefusalEndsTheJobAtOnce: an endpoint that refuses the key ends the job failed at
// its first attempt with model_rejected (docs/lifecycle.md: "failed: a permanent fault (e.g.
// the model rejected the key ...)"), whatever the shape of its error body, and an error of
// megabytes from the endpoint does not keep the job from ending.
//
// Once: a 401 whose body says {"error":"..."} (a string, as TGI, LM Studio and many proxies
// answer) was taken for an unreachable endpoint and retried at every delivery; a 401 whose
// error code is 1.5 MiB went into the job's status and dead letter whole, past NATS's
// max_payload: the status write and the dead letter failed with "nats: maximum payload
// exceeded", the end was "undecided" and the job delivered again past max_deliver, its
// status running for ever.
func TestModelRefusalEndsTheJobAtOnce(t *testing.T) {
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
			ag, err := agent.New(agent.Config{BaseURL: srv.URL + "/v1", HTTPClient: srv.Client(), APIKey: "sk-refused-key",
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
			dls := b.settledLetters()
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

// TestLongRetryAfterHoldsTheJob: an endpoint that answers 503 or 429 with a Retry-After
// longer than the client honours (openai-go's 2 minutes: a maintenance window, an hourly
// quota) is an endpoint that is down for that long. docs/operations.md (BoxcarModelDown): "The
// workers take no new jobs, hold the ones in flight without spending deliveries or turns".
// openai-go gives up on such an answer at its first attempt, so it opens the breaker at once;
// once it was one failure of the breaker's three, the run ended ErrModelUnavailable and the
// job was handed back, every delivery but the one that opened the breaker spent in seconds.
func TestLongRetryAfterHoldsTheJob(t *testing.T) {
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
			held := &downWaits{Gate: gate, waiting: make(chan struct{})}
			ag, err := agent.New(agent.Config{BaseURL: srv.URL + "/v1", HTTPClient: srv.Client(), MaxRetries: 3,
				Gate: held, Profiles: b.cfg.Profiles})
			if err != nil {
				t.Fatal(err)
			}
			b.worker(ag, func(c *runner.Config) { c.ModelGate = gate })
			j := b.submit("p")
			// Until a run waits on the open breaker (the first delivery's, or, had it been handed
			// back, a later one's, whose claim recorded its attempt before), or the first
			// delivery is recorded as no longer running.
			var st job.Status
			waitFor(t, 30*time.Second, "a run to wait for the model endpoint", func() bool {
				select {
				case <-held.waiting:
					st, err = b.q.Status(context.Background(), j.ID)
					return err == nil
				default:
				}
				st, err = b.q.Status(context.Background(), j.ID)
				return err == nil && st.Attempt > 0 && (st.Attempt > 1 || st.State != job.StateRunning)
			})
			if st.Attempt != 1 || st.State != job.StateRunning {
				t.Errorf("the job is at delivery %d of max_deliver 3 (state %s, %d chat requests) while the endpoint asks to wait; want it held running at delivery 1: %s",
					st.Attempt, st.State, chats.Load(), st.Error)
			}
		})
	}
}

// downWaits is a model gate that closes waiting the first time a run waits on it while the
// endpoint is down.
type downWaits struct {
	agent.Gate
	once    sync.Once
	waiting chan struct{}
}

func (g *downWaits) Wait(ctx context.Context) error {
	if !g.Up() {
		g.once.Do(func() { close(g.waiting) })
	}
	return g.Gate.Wait(ctx)
}

// TestAnswerFieldsBoundedInManifest: what the endpoint says about its answer (the response id,
// the model name) is bounded before it goes into the signed manifest, as the tool call ids
// are. Once an answer whose id is 9 MiB (within the agent's 16 MiB bound on an answer)
// committed a run whose manifest recorded it twice (model.response_ids and usage's calls):
// 18 MiB, past the 16 MiB that provenance.Verify, `submit get/verify/logs/gc` and the worker's
// own adoptCommitted read, so the job succeeded and its run could never be verified.
func TestAnswerFieldsBoundedInManifest(t *testing.T) {
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

// TestUnavailableTurnNotSpent: "a request the endpoint was unavailable for is not counted as a
// turn" (docs/lifecycle.md; agent.Budget), in the job's status too. The progress event sent
// before each request counts the turn (a worker that dies while it is out leaves it spent);
// agent.EventModelUnavailable takes it back. Once the runner's budget only ever added: a
// delivery whose request met the endpoint unavailable left a turn spent, and the next
// delivery started with one turn less. Here the model's first chat request meets a 503 with
// a long Retry-After, with no breaker to wait on; the job then runs as the demo model plays it.
func TestUnavailableTurnNotSpent(t *testing.T) {
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

// TestErrorTextBoundedAtEverySink: an attempt's error may quote anyone at any length (here a
// model endpoint's 1.5 MiB, past the agent's own bounds); the runner records at most a few KiB
// of it in the job's status, its dead letter (both NATS messages: past max_payload the job
// could never end), the manifest and report.md, and the job ends at its first attempt.
func TestErrorTextBoundedAtEverySink(t *testing.T) {
	t.Parallel()
	b := setup(t)
	huge := strings.Repeat("k", 3<<19)
	b.worker(agentFunc(func(context.Context, agent.Request) (agent.Result, error) {
		return agent.Result{}, fmt.Errorf("agent: chat completion: %w: HTTP 401 %s", agent.ErrModelAuth, huge)
	}))
	j := b.submit("p")
	st := b.waitFinal(j.ID, 30*time.Second)
	if st.State != job.StateFailed || st.Attempt != 1 {
		t.Fatalf("job %s at attempt %d, want failed at attempt 1: %.300s", st.State, st.Attempt, st.Error)
	}
	const bound = 8 << 10
	sinks := map[string]int{
		"status":   len(st.Error),
		"manifest": len(b.manifest(j.ID).Predicate.Outcome.Error),
	}
	if dls := b.settledLetters(); len(dls) == 1 {
		sinks["dead letter"] = len(dls[0].Error)
	} else {
		t.Errorf("%d dead letters, want 1", len(dls))
	}
	sinks["report.md"] = len(b.runFile(j.ID, "report.md"))
	for sink, n := range sinks {
		if n == 0 || n > bound {
			t.Errorf("the %s holds %d bytes of the error, want some and at most %d", sink, n, bound)
		}
	}
}

// TestRedeliveryWaitsForTheEndpointsRetryAfter: a job whose wait for an unavailable model
// endpoint ends at its job_timeout is delivered again once the endpoint said to come back
// (its Retry-After, bounded as the breaker bounds it: the gate's MaxRetryAfter, 8s here)
// when that is later than retry_backoff (200ms here). Once the redelivery came after the
// backoff alone, and a peer whose breaker was closed took it at once, only to meet the same
// answer and wait out another job_timeout: the job spent its deliveries against an endpoint
// that had said when it would answer. The runner here has no ModelGate, so its fetch loop
// stands for such a peer.
func TestRedeliveryWaitsForTheEndpointsRetryAfter(t *testing.T) {
	t.Parallel()
	b := setup(t)
	p := b.cfg.Profiles["p"]
	p.Limits.JobTimeout = config.Duration(2 * time.Second)
	b.cfg.Profiles["p"] = p
	var firstChat atomic.Int64 // unix nanoseconds
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/json")
		if r.URL.Path == "/v1/models" {
			_, _ = io.WriteString(w, `{"object":"list","data":[]}`)
			return
		}
		firstChat.CompareAndSwap(0, time.Now().UnixNano())
		w.Header().Set("Retry-After", "600")
		w.WriteHeader(http.StatusServiceUnavailable)
		_, _ = io.WriteString(w, `{"error":{"message":"come back in ten minutes","type":"server_error","code":null}}`)
	}))
	t.Cleanup(srv.Close)
	const bound = 8 * time.Second
	gate, err := modelgate.New(modelgate.Config{MaxRetryAfter: bound, Probe: func(ctx context.Context) (*http.Response, error) {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, srv.URL+"/v1/models", nil)
		return srv.Client().Do(req)
	}})
	if err != nil {
		t.Fatal(err)
	}
	ag, err := agent.New(agent.Config{BaseURL: srv.URL + "/v1", HTTPClient: srv.Client(), MaxRetries: 3, Gate: gate, Profiles: b.cfg.Profiles})
	if err != nil {
		t.Fatal(err)
	}
	b.worker(ag)
	j := b.submit("p")
	var st job.Status
	waitFor(t, 30*time.Second, "the second delivery", func() bool {
		st, err = b.q.Status(context.Background(), j.ID)
		return err == nil && (st.Attempt >= 2 || st.State.Terminal())
	})
	after := time.Since(time.Unix(0, firstChat.Load()))
	if st.Attempt != 2 || after < bound-time.Second {
		t.Errorf("the job is %s at delivery %d %s after the endpoint answered 503 with Retry-After 600; want delivery 2 no sooner than %s (the Retry-After, bounded): %s",
			st.State, st.Attempt, after.Round(100*time.Millisecond), bound, st.Error)
	}
}

// TestJobLinesNameTheTenant: a job id is a tenant's (two tenants may each have a job "x";
// the status, cancel and dead-letter keys are tenant.id), so every log line about a job, the
// agent's (one per model request and answer, tool call and the run's end) as the runner's,
// says whose it is: the runner hands the agent its job's logger.
func TestJobLinesNameTheTenant(t *testing.T) {
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
