package modelgate_test

import (
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/boxcar-run/boxcar/internal/modelgate"
	"github.com/boxcar-run/boxcar/internal/testnet"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// endpoint is a model endpoint whose answer a test sets: every request gets status (200 when
// zero) with the headers in header.
type endpoint struct {
	srv    *httptest.Server
	status atomic.Int64
	mu     sync.Mutex
	header http.Header
	hits   atomic.Int64 // requests other than probes
	probes chan time.Time
}

func newEndpoint(t *testing.T) *endpoint {
	e := &endpoint{header: http.Header{}, probes: make(chan time.Time, 100)}
	e.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/v1/models" {
			select {
			case e.probes <- time.Now():
			default: // a test that reads none
			}
		} else {
			e.hits.Add(1)
		}
		e.mu.Lock()
		for k, v := range e.header {
			w.Header()[k] = v
		}
		e.mu.Unlock()
		if s := e.status.Load(); s != 0 {
			w.WriteHeader(int(s))
		}
		_, _ = io.WriteString(w, "{}") // a client that went away is the test's own doing
	}))
	t.Cleanup(e.srv.Close)
	return e
}

func (e *endpoint) probe(ctx context.Context) (*http.Response, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, e.srv.URL+"/v1/models", nil)
	if err != nil {
		return nil, err
	}
	return e.srv.Client().Do(req)
}

// setup returns a gate on e and a client whose requests pass it; ups records OnChange.
func setup(t *testing.T, e *endpoint, cfg modelgate.Config) (*modelgate.Gate, *http.Client, *changes) {
	t.Helper()
	ch := &changes{}
	cfg.Probe = e.probe
	cfg.OnChange = ch.add
	if cfg.MinBackoff == 0 {
		cfg.MinBackoff, cfg.MaxBackoff = 10*time.Millisecond, 40*time.Millisecond
	}
	g, err := modelgate.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return g, &http.Client{Transport: g.Transport(e.srv.Client().Transport)}, ch
}

type changes struct {
	mu  sync.Mutex
	ups []bool
}

func (c *changes) add(up bool) { c.mu.Lock(); c.ups = append(c.ups, up); c.mu.Unlock() }

func (c *changes) get() []bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]bool(nil), c.ups...)
}

func post(c *http.Client, url string) error {
	resp, err := c.Post(url+"/v1/chat/completions", "application/json", nil)
	if err != nil {
		return err
	}
	resp.Body.Close()
	return nil
}

func TestGateHoldsRequestsWhileTheEndpointFailsAndReleasesThemWhenItAnswers(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name   string
		status int
	}{
		{name: "5xx", status: http.StatusServiceUnavailable},
		{name: "429", status: http.StatusTooManyRequests},
		{name: "408", status: http.StatusRequestTimeout},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			e := newEndpoint(t)
			g, c, ch := setup(t, e, modelgate.Config{Threshold: 3})
			e.status.Store(int64(tt.status))
			for i := range 3 {
				if !g.Up() {
					t.Fatalf("open after %d failures, want 3", i)
				}
				if err := post(c, e.srv.URL); err != nil {
					t.Fatal(err)
				}
			}
			if g.Up() || g.Err() == nil {
				t.Fatalf("still up after 3 failures: state %s, err %v", g.State(), g.Err())
			}
			// While open, a request is refused without reaching the endpoint.
			before := e.hits.Load()
			if err := post(c, e.srv.URL); !errors.Is(err, modelgate.ErrOpen) {
				t.Fatalf("request while open: %v, want ErrOpen", err)
			}
			if n := e.hits.Load() - before; n != 0 {
				t.Fatalf("%d requests reached the endpoint while open", n)
			}
			// Waiters wait through failed probes and go on once one is answered.
			done := make(chan error, 1)
			go func() { done <- g.Wait(context.Background()) }()
			<-e.probes
			<-e.probes // two probes failed: the waiter is still waiting
			select {
			case err := <-done:
				t.Fatalf("Wait returned %v while the endpoint failed", err)
			default:
			}
			e.status.Store(0)
			if err := <-done; err != nil {
				t.Fatal(err)
			}
			if !g.Up() || g.Err() != nil {
				t.Fatalf("after an answered probe: state %s, err %v", g.State(), g.Err())
			}
			if err := post(c, e.srv.URL); err != nil {
				t.Fatal(err)
			}
			if got := ch.get(); len(got) != 2 || got[0] || !got[1] {
				t.Errorf("OnChange calls %v, want [false true]", got)
			}
		})
	}
}

func TestGateOpensWhenTheEndpointIsUnreachable(t *testing.T) {
	t.Parallel()
	e := newEndpoint(t)
	dead := "http://" + testnet.ClosedAddr(t) // refuses connections for the whole test
	g, c, _ := setup(t, e, modelgate.Config{Threshold: 2})
	for range 2 {
		if err := post(c, dead); err == nil {
			t.Fatal("a request to a closed port succeeded")
		}
	}
	if g.Up() {
		t.Fatal("still up after 2 refused connections")
	}
	if err := g.Err(); err == nil {
		t.Fatal("Err is nil while open")
	}
	// The probe goes to e, which answers: the gate closes.
	if err := g.Wait(context.Background()); err != nil {
		t.Fatal(err)
	}
}

func TestGateHonoursRetryAfter(t *testing.T) {
	t.Parallel()
	e := newEndpoint(t)
	e.header.Set("Retry-After", "1")
	e.status.Store(http.StatusTooManyRequests)
	g, c, _ := setup(t, e, modelgate.Config{Threshold: 1})
	if err := post(c, e.srv.URL); err != nil {
		t.Fatal(err)
	}
	opened := time.Now()
	if g.Up() {
		t.Fatal("a 429 at threshold 1 left it up")
	}
	e.status.Store(0)
	if err := g.Wait(context.Background()); err != nil {
		t.Fatal(err)
	}
	// The backoff is 10ms; the endpoint asked for a second.
	if probed := <-e.probes; probed.Sub(opened) < time.Second {
		t.Errorf("probed %s after a 429 with Retry-After: 1", probed.Sub(opened))
	}
}

// TestGateOpensAtOnceOnAnAnswerTheClientDoesNotRetry: a 429 or 5xx that asks for a wait longer
// than the OpenAI client makes (2 minutes), or says x-should-retry: false, is the endpoint
// saying it is down for now: the client gives up at that one attempt, so it opens the breaker
// at once, or the job would end without waiting on it. A Retry-After the client waits for is
// one failure of the threshold's, as before.
func TestGateOpensAtOnceOnAnAnswerTheClientDoesNotRetry(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name   string
		status int
		header map[string]string
		opens  bool
	}{
		{name: "503 with Retry-After of ten minutes", status: http.StatusServiceUnavailable, header: map[string]string{"Retry-After": "600"}, opens: true},
		{name: "429 with retry-after-ms of an hour", status: http.StatusTooManyRequests, header: map[string]string{"Retry-After-Ms": "3600000"}, opens: true},
		{name: "429 with Retry-After past a Duration", status: http.StatusTooManyRequests, header: map[string]string{"Retry-After": "1e300"}, opens: true},
		{name: "500 with x-should-retry false", status: http.StatusInternalServerError, header: map[string]string{"X-Should-Retry": "false"}, opens: true},
		{name: "503 with Retry-After of a minute", status: http.StatusServiceUnavailable, header: map[string]string{"Retry-After": "60"}, opens: false},
		{name: "503 with x-should-retry true", status: http.StatusServiceUnavailable, header: map[string]string{"X-Should-Retry": "true"}, opens: false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			e := newEndpoint(t)
			for k, v := range tt.header {
				e.header.Set(k, v)
			}
			e.status.Store(int64(tt.status))
			g, c, _ := setup(t, e, modelgate.Config{Threshold: 3})
			if err := post(c, e.srv.URL); err != nil {
				t.Fatal(err)
			}
			if got := !g.Up(); got != tt.opens {
				t.Errorf("open after one answer: %v, want %v (state %s)", got, tt.opens, g.State())
			}
		})
	}
}

func TestGateIgnoresRequestsTheCallerCancelled(t *testing.T) {
	t.Parallel()
	e := newEndpoint(t)
	hold := make(chan struct{})
	defer close(hold)
	slow := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-hold:
		case <-r.Context().Done():
		}
	}))
	defer slow.Close()
	g, c, _ := setup(t, e, modelgate.Config{Threshold: 1})
	ctx, cancel := context.WithCancel(context.Background())
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, slow.URL, nil)
	errc := make(chan error, 1)
	go func() {
		resp, err := c.Do(req)
		if err == nil {
			resp.Body.Close()
		}
		errc <- err
	}()
	time.AfterFunc(50*time.Millisecond, cancel)
	if err := <-errc; err == nil {
		t.Fatal("a cancelled request succeeded")
	}
	if !g.Up() {
		t.Fatalf("a request its caller cancelled opened the gate: %v", g.Err())
	}
}

func TestGateWaitEndsWithItsContext(t *testing.T) {
	t.Parallel()
	e := newEndpoint(t)
	e.status.Store(http.StatusBadGateway)
	g, c, _ := setup(t, e, modelgate.Config{Threshold: 1})
	if err := post(c, e.srv.URL); err != nil {
		t.Fatal(err)
	}
	cause := errors.New("job timeout")
	ctx, cancel := context.WithCancelCause(context.Background())
	go func() { <-e.probes; cancel(cause) }()
	if err := g.Wait(ctx); !errors.Is(err, cause) {
		t.Fatalf("Wait: %v, want the context's cause", err)
	}
	if g.Up() {
		t.Fatal("up after a wait that ended")
	}
}

func TestNewRefusesABadConfig(t *testing.T) {
	t.Parallel()
	probe := func(context.Context) (*http.Response, error) { return nil, errors.New("x") }
	tests := []struct {
		name string
		cfg  modelgate.Config
	}{
		{name: "no probe", cfg: modelgate.Config{}},
		{name: "negative threshold", cfg: modelgate.Config{Probe: probe, Threshold: -1}},
		{name: "backoff upside down", cfg: modelgate.Config{Probe: probe, MinBackoff: time.Minute, MaxBackoff: time.Second}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if _, err := modelgate.New(tt.cfg); !errors.Is(err, modelgate.ErrInvalidConfig) {
				t.Fatalf("New: %v, want ErrInvalidConfig", err)
			}
		})
	}
}

// bodyServer answers every request 200 with a body that the path says how to end: /cut
// breaks the connection off after a few bytes of the 1000 it announced, /stall sends a few
// bytes and then nothing until the client goes, /long sends 1 MiB.
func bodyServer(t *testing.T) *httptest.Server {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/cut/v1/chat/completions", "/cut/v1/models":
			conn, buf, err := w.(http.Hijacker).Hijack()
			if err != nil {
				return
			}
			_, _ = buf.WriteString("HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n{\"id\":")
			_ = buf.Flush()
			conn.Close()
		case "/stall/v1/chat/completions":
			_, _ = io.WriteString(w, `{"id":`)
			w.(http.Flusher).Flush()
			<-r.Context().Done()
		default:
			_, _ = w.Write(make([]byte, 1<<20))
		}
	}))
	t.Cleanup(srv.Close)
	return srv
}

// TestGateJudgesAnAnswerWhenItsBodyEnds: an endpoint (or a proxy before it) that answers 200
// and then breaks the body off or stalls gives no answer: the agent counts it as the endpoint
// unavailable and the client retries it. The gate opens on such answers as on refused
// connections; a body its reader stops reading (the agent's size cap) is an answer, and one
// the caller gave up on is no news.
func TestGateJudgesAnAnswerWhenItsBodyEnds(t *testing.T) {
	t.Parallel()
	srv := bodyServer(t)
	tests := []struct {
		name    string
		path    string
		timeout time.Duration // of each request; 0: none
		cancel  bool          // the caller cancels each request while it reads the body
		read    int64         // bytes read before the body is closed; -1: all
		wantUp  bool
	}{
		{name: "a body that breaks off", path: "/cut", read: -1, wantUp: false},
		{name: "a body that stalls past the request's deadline", path: "/stall", timeout: 2 * time.Second, read: -1, wantUp: false},
		{name: "a body its reader stops reading", path: "/long", read: 10, wantUp: true},
		{name: "a body whose caller gave up", path: "/stall", cancel: true, read: 1, wantUp: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			g, c, _ := setup(t, newEndpoint(t), modelgate.Config{Threshold: 3, MinBackoff: time.Minute, MaxBackoff: time.Minute})
			for range 3 {
				ctx, cancel := context.WithCancel(context.Background())
				if tt.timeout > 0 {
					ctx, cancel = context.WithTimeout(ctx, tt.timeout)
				}
				req, err := http.NewRequestWithContext(ctx, http.MethodPost, srv.URL+tt.path+"/v1/chat/completions", nil)
				if err != nil {
					t.Fatal(err)
				}
				resp, err := c.Do(req)
				if err != nil {
					t.Fatalf("the status line should arrive: %v", err)
				}
				if tt.read < 0 {
					_, _ = io.ReadAll(resp.Body)
				} else {
					_, _ = io.CopyN(io.Discard, resp.Body, tt.read)
				}
				if tt.cancel {
					cancel()
					_, _ = io.ReadAll(resp.Body)
				}
				resp.Body.Close()
				cancel()
			}
			if g.Up() != tt.wantUp {
				t.Errorf("after 3 such answers the gate is up = %v (%v), want %v", g.Up(), g.Err(), tt.wantUp)
			}
		})
	}
}

// TestGateProbeJudgesTheAnswerWhenItsBodyEnds: a probe whose answer breaks off does not close
// the gate; the endpoint answering it whole does.
func TestGateProbeJudgesTheAnswerWhenItsBodyEnds(t *testing.T) {
	t.Parallel()
	srv := bodyServer(t)
	var path atomic.Value
	path.Store("/cut")
	g, err := modelgate.New(modelgate.Config{Threshold: 1, MinBackoff: time.Millisecond, MaxBackoff: time.Millisecond,
		Probe: func(ctx context.Context) (*http.Response, error) {
			req, err := http.NewRequestWithContext(ctx, http.MethodGet, srv.URL+path.Load().(string)+"/v1/models", nil)
			if err != nil {
				return nil, err
			}
			return srv.Client().Do(req)
		}})
	if err != nil {
		t.Fatal(err)
	}
	c := &http.Client{Transport: g.Transport(srv.Client().Transport)}
	resp, err := c.Post(srv.URL+"/cut/v1/chat/completions", "application/json", nil)
	if err != nil {
		t.Fatal(err)
	}
	_, _ = io.ReadAll(resp.Body)
	resp.Body.Close()
	if g.Up() {
		t.Fatal("the gate is up after an answer that broke off, with a threshold of 1")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	if err := g.Wait(ctx); err == nil {
		t.Fatal("Wait returned: a probe whose answer broke off closed the gate")
	}
	if err := g.Err(); err == nil || strings.Contains(err.Error(), "127.0.0.1") {
		t.Errorf("Err = %v, want why it is down without the endpoint's address", err)
	}
	path.Store("/long")
	if err := g.Wait(context.Background()); err != nil {
		t.Fatal(err)
	}
}

func postAs(c *http.Client, url, job string) error {
	req, err := http.NewRequestWithContext(modelgate.WithJob(context.Background(), job), http.MethodPost, url+"/v1/chat/completions", nil)
	if err != nil {
		return err
	}
	resp, err := c.Do(req)
	if err != nil {
		return err
	}
	resp.Body.Close()
	return nil
}

// TestGateTellsOneJobsFailuresFromAnOutage: a run of failures of one job's requests alone
// (a context the server fails on) leaves the breaker closed, and the probe judges them when the
// job asks whether to hold its turn (Held): answered, they are the job's own (its turn fails,
// the worker goes on fetching and /readyz stays up); failed, the endpoint is down and the
// breaker opens, on a worker running that job alone too. Two jobs' failures open it at once, as
// do one job's 429s, which speak of the endpoint's load.
func TestGateTellsOneJobsFailuresFromAnOutage(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name        string
		jobs        []string // whose requests fail, in turn
		status      int      // their answer: 500 when zero
		probeStatus int
		want        modelgate.Verdict
		wantUps     []bool
		wantProbes  int
		// wantVerdicts is what OnVerdict heard: true for the job's own failures.
		wantVerdicts []bool
	}{
		{name: "one job, the probe answered: its own failures", jobs: []string{"a", "a", "a"}, probeStatus: http.StatusOK,
			want: modelgate.Own, wantProbes: 1, wantVerdicts: []bool{true}},
		{name: "one job, the probe failed: an outage", jobs: []string{"a", "a", "a"}, probeStatus: http.StatusBadGateway,
			want: modelgate.Hold, wantUps: []bool{false}, wantProbes: 1, wantVerdicts: []bool{false}},
		{name: "two jobs: an outage, no probe first", jobs: []string{"a", "b", "a"}, probeStatus: http.StatusOK,
			want: modelgate.Hold, wantUps: []bool{false}},
		{name: "one job's 429s speak of the endpoint: an outage, no probe first", jobs: []string{"a", "a", "a"},
			status: http.StatusTooManyRequests, probeStatus: http.StatusOK, want: modelgate.Hold, wantUps: []bool{false}},
		{name: "one job, its failures short of the threshold: they pass", jobs: []string{"a", "a"}, probeStatus: http.StatusOK,
			want: modelgate.Pass},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			chat, models := newEndpoint(t), newEndpoint(t)
			chat.status.Store(http.StatusInternalServerError)
			if tt.status != 0 {
				chat.status.Store(int64(tt.status))
			}
			models.status.Store(int64(tt.probeStatus))
			verdicts := &changes{}
			g, c, ch := setup(t, models, modelgate.Config{Threshold: 3, MinBackoff: time.Minute, MaxBackoff: time.Minute, OnVerdict: verdicts.add})
			for _, job := range tt.jobs {
				if err := postAs(c, chat.srv.URL, job); err != nil {
					t.Fatal(err)
				}
			}
			// Both of the job's turns in flight ask; one probe judges them.
			held := make(chan modelgate.Verdict, 2)
			for range 2 {
				go func() { held <- g.Held(modelgate.WithJob(context.Background(), "a")) }()
			}
			for range 2 {
				if got := <-held; got != tt.want {
					t.Errorf("Held = %v, want %v (state %s)", got, tt.want, g.State())
				}
			}
			if got := ch.get(); len(got) != len(tt.wantUps) {
				t.Errorf("OnChange calls %v, want %v", got, tt.wantUps)
			}
			if n := len(models.probes); n != tt.wantProbes {
				t.Errorf("%d probes, want %d", n, tt.wantProbes)
			}
			if got := verdicts.get(); !slices.Equal(got, tt.wantVerdicts) {
				t.Errorf("OnVerdict calls %v, want %v", got, tt.wantVerdicts)
			}
			if tt.want != modelgate.Hold && (!g.Up() || g.Held(modelgate.WithJob(context.Background(), "b")) != modelgate.Pass) {
				t.Errorf("after the job's own failures: state %s, another job held", g.State())
			}
		})
	}
}

// TestGateOpensWhenJobAfterJobFailsAlone: an endpoint that answers the probe (GET /models) and
// fails every chat request, on a worker running one job at a time: the first job's failures
// are judged its own, but the next job's, with no request answered in between, open the
// breaker, and the worker fetches no more jobs to fail. The probe that closes it again is
// answered as GET /models always is: the held job's turn, sent again, fails alone, and it
// still holds (no request was answered), where it was judged its own and spent a delivery.
func TestGateOpensWhenJobAfterJobFailsAlone(t *testing.T) {
	t.Parallel()
	chat, models := newEndpoint(t), newEndpoint(t)
	chat.status.Store(http.StatusInternalServerError)
	g, c, ch := setup(t, models, modelgate.Config{Threshold: 3})
	for i, job := range []string{"a", "b", "b"} {
		if i == 2 {
			if err := g.Wait(context.Background()); err != nil { // the probe closes it
				t.Fatal(err)
			}
		}
		for range 3 {
			if err := postAs(c, chat.srv.URL, job); err != nil {
				t.Fatal(err)
			}
		}
		want := []modelgate.Verdict{modelgate.Own, modelgate.Hold, modelgate.Hold}[i]
		if got := g.Held(modelgate.WithJob(context.Background(), job)); got != want {
			t.Errorf("job %s, its turn %d: Held = %v, want %v", job, i, got, want)
		}
	}
	if got := ch.get(); !slices.Equal(got, []bool{false, true, false}) {
		t.Errorf("OnChange calls %v, want [false true false]", got)
	}
}
