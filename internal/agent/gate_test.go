package agent_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/boxcar-run/boxcar/internal/agent"
	"github.com/boxcar-run/boxcar/internal/config"
	"github.com/boxcar-run/boxcar/internal/modelgate"
)

// outage is a probe for a modelgate.Gate: the endpoint is down until up is set. Probes do not
// reach the scripted server, whose replies are the chat requests' only.
type outage struct {
	up     atomic.Bool
	probes atomic.Int64
}

func (o *outage) probe(context.Context) (*http.Response, error) {
	o.probes.Add(1)
	if o.up.Load() {
		return &http.Response{StatusCode: http.StatusOK, Body: http.NoBody}, nil
	}
	return &http.Response{StatusCode: http.StatusServiceUnavailable, Body: http.NoBody}, nil
}

// gated returns a gate that opens after 3 failed attempts (one chat request with the tests'
// 2 retries) and probes o every few milliseconds; downs receives each opening.
func gated(t *testing.T, o *outage) (*modelgate.Gate, <-chan struct{}) {
	t.Helper()
	downs := make(chan struct{}, 16)
	g, err := modelgate.New(modelgate.Config{Threshold: 3, MinBackoff: 5 * time.Millisecond, MaxBackoff: 20 * time.Millisecond,
		Probe: o.probe, OnChange: func(up bool) {
			if !up {
				downs <- struct{}{}
			}
		}})
	if err != nil {
		t.Fatal(err)
	}
	return g, downs
}

// TestTurnWaitsForTheModelGate: a turn that finds the endpoint down waits until a probe is
// answered and is sent again; the run ends as it would have without the outage, with the same
// turns spent.
func TestTurnWaitsForTheModelGate(t *testing.T) {
	fast := map[string]string{"retry-after-ms": "1"}
	s := newScript(t, toolCalls(1000, call{"a", "emit", `{"text":"a"}`}),
		apiError(503, "", "overloaded", fast), apiError(502, "", "bad gateway", fast), apiError(503, "", "overloaded", fast),
		final("done"))
	o := &outage{}
	g, downs := gated(t, o)
	go func() {
		<-downs
		// Up only after a probe failed: the turn waited through it.
		for o.probes.Load() < 2 {
			time.Sleep(time.Millisecond)
		}
		o.up.Store(true)
	}()
	req := request(csvProfile(t, emitTool), newFakeSandbox(nil))
	var mu sync.Mutex
	var events []agent.Event
	req.Progress = func(e agent.Event) { mu.Lock(); events = append(events, e); mu.Unlock() }
	res, err := newAgent(t, s, func(c *agent.Config) { c.Gate = g }).Run(context.Background(), req)
	if err != nil {
		t.Fatalf("Run: %v", err)
	}
	if res.Outcome != agent.OutcomeCompleted || res.FinalMessage != "done" {
		t.Fatalf("outcome %q final %q, want completed with the answer after the outage", res.Outcome, res.FinalMessage)
	}
	if want := (agent.Budget{Turns: 2, ToolCalls: 1, Tokens: 1500}); res.Spent != want || res.Turns != 2 {
		t.Errorf("spent %+v turns %d, want %+v and 2 turns, as without the outage", res.Spent, res.Turns, want)
	}
	if n := len(s.requests()); n != 5 {
		t.Errorf("%d chat requests, want 5: 2 answered, 3 attempts of the refused one", n)
	}
	mu.Lock()
	defer mu.Unlock()
	for _, e := range events {
		if e.Spent.Turns > 2 {
			t.Errorf("event %s turn %d reports %d turns spent, more than the run's 2", e.Kind, e.Turn, e.Spent.Turns)
		}
	}
}

// TestModelGateWaitEndsAtTheJobTimeout: a job whose endpoint stays down waits until its own
// timeout, and then ends with ErrModelUnavailable (to be tried again), not capped: it hit no
// cap of its own.
func TestModelGateWaitEndsAtTheJobTimeout(t *testing.T) {
	fast := map[string]string{"retry-after-ms": "1"}
	s := newScript(t, apiError(503, "", "overloaded", fast), apiError(503, "", "overloaded", fast), apiError(503, "", "overloaded", fast))
	g, _ := gated(t, &outage{})
	p := csvProfile(t)
	p.Limits.JobTimeout = config.Duration(500 * time.Millisecond)
	res, err := newAgent(t, s, func(c *agent.Config) { c.Gate = g }).Run(context.Background(), request(p, newFakeSandbox(nil)))
	if !errors.Is(err, agent.ErrModelUnavailable) {
		t.Fatalf("Run: %v (outcome %q cap %q), want ErrModelUnavailable", err, res.Outcome, res.Cap)
	}
	if res.Cap != "" || res.Spent.Turns != 0 {
		t.Errorf("cap %q, %d turns spent; want no cap and no turn", res.Cap, res.Spent.Turns)
	}
}

// TestModelGateWaitEndsWithTheCaller: a shutdown or cancel ends the wait at once with the
// caller's cause.
func TestModelGateWaitEndsWithTheCaller(t *testing.T) {
	fast := map[string]string{"retry-after-ms": "1"}
	s := newScript(t, apiError(503, "", "overloaded", fast), apiError(503, "", "overloaded", fast), apiError(503, "", "overloaded", fast))
	g, downs := gated(t, &outage{})
	ctx, cancel := context.WithCancelCause(context.Background())
	stop := errors.New("worker shutting down")
	go func() { <-downs; cancel(stop) }()
	_, err := newAgent(t, s, func(c *agent.Config) { c.Gate = g }).Run(ctx, request(csvProfile(t), newFakeSandbox(nil)))
	if !errors.Is(err, stop) || !errors.Is(err, context.Canceled) {
		t.Fatalf("Run: %v, want the caller's cause", err)
	}
}

// TestFailureTheModelGateLetsPassEndsTheRun: a request that failed while the gate still lets
// requests pass (fewer failures than its threshold) ends the run as without a gate: the gate
// is for an outage, not a reason to send a turn again and again.
func TestFailureTheModelGateLetsPassEndsTheRun(t *testing.T) {
	fast := map[string]string{"retry-after-ms": "1"}
	s := newScript(t, apiError(503, "", "overloaded", fast), apiError(503, "", "overloaded", fast), apiError(503, "", "overloaded", fast))
	g, err := modelgate.New(modelgate.Config{Threshold: 10, Probe: (&outage{}).probe})
	if err != nil {
		t.Fatal(err)
	}
	_, err = newAgent(t, s, func(c *agent.Config) { c.Gate = g }).Run(context.Background(), request(csvProfile(t), newFakeSandbox(nil)))
	if !errors.Is(err, agent.ErrModelUnavailable) {
		t.Fatalf("Run: %v, want ErrModelUnavailable", err)
	}
	if n := len(s.requests()); n != 3 {
		t.Errorf("%d requests, want the 3 attempts of one", n)
	}
}

// TestOneJobsOwnFailuresHoldNoOtherJob: a job whose requests the endpoint fails every time
// (a context that makes a self-hosted server answer 5xx) while the endpoint answers everything
// else, probes included, is at fault itself: its turn fails (the runner retries the job by its
// own policy) after one request's attempts, and the breaker, which is the worker's, stays
// closed. It used to open on that one request's 3 attempts, close at the probe, open again at
// the turn sent again, for the job's whole job_timeout: the worker fetched nothing meanwhile,
// and another job's requests were refused.
func TestOneJobsOwnFailuresHoldNoOtherJob(t *testing.T) {
	var poisoned atomic.Int64
	poison := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		poisoned.Add(1)
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusInternalServerError)
		_, _ = io.WriteString(w, `{"error":{"message":"the server failed on this context"}}`)
	}))
	t.Cleanup(poison.Close)
	o := &outage{}
	o.up.Store(true) // the endpoint answers probes
	var opened atomic.Int64
	downs := make(chan struct{}, 1)
	// The first probe is a second away: another job that starts when the breaker opens meets
	// it open.
	g, err := modelgate.New(modelgate.Config{Threshold: 3, MinBackoff: time.Second, MaxBackoff: time.Second,
		Probe: o.probe, OnChange: func(up bool) {
			if !up && opened.Add(1) == 1 {
				downs <- struct{}{}
			}
		}})
	if err != nil {
		t.Fatal(err)
	}
	p := csvProfile(t)
	p.Limits.JobTimeout = config.Duration(3 * time.Second)
	bad := newAgent(t, newScript(t), func(c *agent.Config) { c.Gate, c.BaseURL, c.HTTPClient = g, poison.URL+"/v1", poison.Client() })
	badReq := request(p, newFakeSandbox(nil))
	badReq.JobID = "20261207t113000-badbadbadbad"
	badDone := make(chan error, 1)
	go func() { _, err := bad.Run(context.Background(), badReq); badDone <- err }()
	// The other job starts when the breaker opens, or when the failing job has ended.
	var badErr error
	select {
	case <-downs:
		badErr = nil
	case badErr = <-badDone:
	}
	s := newScript(t, final("done"))
	held := &heldCount{Gate: g}
	res, err := newAgent(t, s, func(c *agent.Config) { c.Gate = held }).Run(context.Background(), request(p, newFakeSandbox(nil)))
	if err != nil || res.Outcome != agent.OutcomeCompleted {
		t.Errorf("the other job, whose requests the endpoint answers: %v (outcome %q)", err, res.Outcome)
	}
	if badErr == nil {
		badErr = <-badDone
	}
	if !errors.Is(badErr, agent.ErrModelUnavailable) {
		t.Errorf("the failing job: %v, want ErrModelUnavailable (its delivery is tried again)", badErr)
	}
	// Its status says why it spent a delivery in seconds: the endpoint answered the rest.
	if !strings.Contains(fmt.Sprint(badErr), "its failures were this job's own") {
		t.Errorf("the failing job's error %q does not say the failures were its own", badErr)
	}
	if n, h := opened.Load(), held.n.Load(); n != 0 || h != 0 {
		t.Errorf("one job's failures opened the worker's breaker %d times and held the other job's turns %d times; want 0 and 0", n, h)
	}
	if n := poisoned.Load(); n != 3 {
		t.Errorf("the failing job sent %d requests, want the 3 attempts of one turn", n)
	}
}

// heldCount counts the waits of a run that found the breaker open.
type heldCount struct {
	*modelgate.Gate
	n atomic.Int64
}

func (g *heldCount) Wait(ctx context.Context) error {
	if !g.Up() {
		g.n.Add(1)
	}
	return g.Gate.Wait(ctx)
}
